from cockpit.cli import entry

entry()
