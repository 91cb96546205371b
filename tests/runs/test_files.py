

def test_grid_settings_round_trip_and_matching():
    from hf_mecheval.runs.files import GridSettings

    settings = GridSettings(n=32, seed=None, sites=("layers.0.input",), resamples=100)
    assert GridSettings.from_flags(settings.flags()) == settings
    assert GridSettings.from_flags(["-n", "8", "--batch-size", "4"]) == GridSettings(n=8)   # batch size: same result
    grid = {"settings": settings.record(dataset_seed=5), "examples": 32, "run": {"split": "test", "dataset_seed": 5}}
    assert settings.matches(grid, dataset_seed=5)
    assert not GridSettings(n=32, resamples=100).matches(grid, 5)             # every site, not one
    assert not settings.matches(grid, dataset_seed=6)                          # the run's seed differs
    # a grid from before settings were recorded: compared on its documents, split and seed
    legacy = {"examples": 320, "run": {"split": "test", "dataset_seed": 0}}
    assert GridSettings().matches(legacy, 0) and not GridSettings(n=256).matches(legacy, 0)
