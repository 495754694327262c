"""The Kubernetes objects of each job kind (pods, Volcano Job, MPIJob) and how each kind's pods are read."""
