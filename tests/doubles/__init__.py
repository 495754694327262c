"""Test doubles of airflow-mpi: the Kubernetes API double and its kubelet, the controllers'
emulations (Volcano, coscheduling, Kueue, mpi-operator), the apiserver's validation rules and
PodSecurity admission. Test code: it lives under tests/ and never reaches the wheel."""
