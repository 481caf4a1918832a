"""Running a job: entry point, launcher, pre-flight, checkpoints, recipes and rehearsals."""
