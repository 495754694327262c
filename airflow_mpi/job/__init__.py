"""Planning one job: names, hosts and slots, the mpiexec command line, per-job ssh material, the plan."""
