import sys

from tests.cluster.cluster import main

sys.exit(main(sys.argv[1:]))
