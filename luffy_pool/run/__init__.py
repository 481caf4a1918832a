"""Running a job: entry point, launcher, pre-flight, checkpoints, run outputs, recipes and rehearsals."""
