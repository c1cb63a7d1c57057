"""Controller: installs the aggregation program and a job's configuration over P4Runtime."""
