"""GridSettings: as a job file and interventions.json hold them, and as flags."""
import dataclasses
import json

import pytest


def test_grid_settings_round_trip_and_matching():
    from hf_mecheval.runs.files import GridSettings

    settings = GridSettings(n=32, seed=None, sites=("layers.0.input",), resamples=100)
    # as a job file holds them, and back; the flags that ask for them, as `mecheval evaluate` reads them
    assert GridSettings.from_record(json.loads(json.dumps(dataclasses.asdict(settings)))) == settings
    for bad in ({"n": 32}, {**dataclasses.asdict(settings), "n": "32"}, {**dataclasses.asdict(settings), "sites": "x"}):
        with pytest.raises(ValueError):
            GridSettings.from_record(bad)
    from hf_mecheval.cli import build_parser

    args = build_parser().parse_args(["evaluate", "run", *settings.flags()])
    assert (args.n, args.split, args.seed, tuple(args.sites), args.resamples) == \
        (settings.n, settings.split, settings.seed, settings.sites, settings.resamples)
    grid = {"settings": settings.record(dataset_seed=5), "examples": 32, "run": {"split": "test", "dataset_seed": 5}}
    assert settings.matches(grid, dataset_seed=5)
    assert not GridSettings(n=32, resamples=100).matches(grid, 5)             # every site, not one
    assert not settings.matches(grid, dataset_seed=6)                          # the run's seed differs
    # a grid from before settings were recorded: compared on its documents, split and seed
    legacy = {"examples": 320, "run": {"split": "test", "dataset_seed": 0}}
    assert GridSettings().matches(legacy, 0) and not GridSettings(n=256).matches(legacy, 0)


@pytest.mark.parametrize("settings", [
    [], "test", None, 7, {"split": "test"},                                        # another type; keys lost
    {"n": 320, "split": "test", "seed": 0, "sites": None},                          # one key lost
    {"n": 320, "split": "test", "seed": 0, "sites": None, "resamples": 1000, "x": 1},   # one added
])
def test_grid_settings_that_cannot_be_read_whole_match_nothing(settings):
    """A grid whose recorded settings are not the whole record (another type, a key lost or added)
    is never reused: it is made again, instead of being compared on the keys it kept."""
    from hf_mecheval.runs.files import GridSettings

    whole = {"n": 320, "split": "test", "seed": 0, "sites": None, "resamples": 1000}
    grid = {"examples": 320, "run": {"split": "test", "dataset_seed": 0}}
    assert GridSettings().matches({**grid, "settings": whole}, 0)
    assert not GridSettings().matches({**grid, "settings": settings}, 0)
    # a grid from before settings were recorded: each thing it is compared on must be there
    assert not GridSettings().matches({"run": {"split": "test", "dataset_seed": 0}}, 0)
    assert not GridSettings().matches({"examples": 320, "run": "test"}, 0)
