import sys

from shardsink.cli import main

sys.exit(main())
