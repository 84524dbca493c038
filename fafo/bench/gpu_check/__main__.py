"""``python -m fafo.bench.gpu_check --out DIR [--device cuda|cpu] [--quick] [--budget-s N]``"""

import sys

from fafo.bench.gpu_check.run import main

if __name__ == "__main__":
    sys.exit(main())
