"""The job service behind the HTTP API: SQLite store, submission checks, worker processes."""
