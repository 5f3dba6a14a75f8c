"""The front doors: the `znni` command line, the HTTP API, the job store and worker."""
