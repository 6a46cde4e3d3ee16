from neuron_prof.capture.schedule import Action, schedule


def test_cycle_matches_torch_profiler_semantics():
    s = schedule(wait=1, warmup=1, active=2, repeat=2)
    got = [s.action(i) for i in range(10)]
    N, W, R = Action.NONE, Action.WARMUP, Action.RECORD
    assert got == [N, W, R, R, N, W, R, R, N, N]


def test_skip_first_and_endless_repeat():
    s = schedule(wait=0, warmup=0, active=1, skip_first=2)
    assert [s.action(i) for i in range(5)] == [Action.NONE, Action.NONE] + [Action.RECORD] * 3
