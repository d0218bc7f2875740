"""No engine: a layout's own program (a training job, a script); the cockpit watches its processes
and log by the layout's own rules alone."""

from cockpit.engines.base import Engine

ENGINE = Engine(name="none")
