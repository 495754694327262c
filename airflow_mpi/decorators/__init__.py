"""TaskFlow decorators: ``@task.mpi``."""
