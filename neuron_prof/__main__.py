import sys

from neuron_prof.cli import main

sys.exit(main())
