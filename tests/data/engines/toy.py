"""A toy engine, plugged in by this one module (tests/architecture/test_engines.py): what a new engine
brings, and nothing more."""

from cockpit.engines.base import Engine, Failure

ENGINE = Engine(
    name="toy",
    title="Toy",
    default_port=7777,
    metrics_path="/stats",
    metrics={"generation_tokens": ("toy_tokens_out_total",), "running": ("toy_busy",)},
    titles=("toy::",),
    launchers=("toy.serve",),
    shm_prefixes=("toy_shm_",),
    packages=("toy-engine",),
    phase_words=("TOY",),
    phases=(
        (r"TOY booting", "starting"),
        (r"TOY weights \d+/\d+", "loading weights"),
        (r"TOY listening on", "port open"),
        (r"TOY ready", "ready"),
    ),
    failures=(Failure(r"TOY rank (?P<rank>\d+) fell over", header=True),),
)
