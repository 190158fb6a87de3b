from shardsink.cli import run

run()
