"""The recipe's callbacks: the wall clock and its budget across a resume, the stop on SIGINT/SIGTERM, the progress
bar in minutes, the curves."""

import os
import signal

import pytest
from transformers import TrainerControl, TrainerState

from vaswani_mt.training.arguments import parse_args
from vaswani_mt.training.callbacks import (
    BudgetProgressCallback,
    PreemptionCallback,
    WallClockCallback,
    plot_curves,
    trained_seconds,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.transformers_internals]


def test_the_clock_counts_on_after_a_resume_and_stops_at_the_budget():
    clock = WallClockCallback(checkpoint_minutes=1.5, budget_minutes=10)
    clock.elapsed = 590.0
    resumed = WallClockCallback(checkpoint_minutes=1.5, budget_minutes=10)
    resumed.on_train_begin(None, TrainerState(stateful_callbacks=[clock]), TrainerControl())
    assert resumed.elapsed == 590.0 and trained_seconds(TrainerState()) == 0.0
    assert not resumed.on_step_end(None, TrainerState(), TrainerControl()).should_training_stop
    resumed.start -= 10.0  # ten more seconds: the budget's 600 are spent
    control = resumed.on_step_end(None, TrainerState(), TrainerControl())
    assert control.should_training_stop and control.should_save  # the last weights are saved


def test_progress_bar_counts_minutes_of_the_budget_not_max_steps(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path), "--report_to", "none"])[3]
    clock = WallClockCallback(budget_minutes=27)
    bar = BudgetProgressCallback(clock)
    state = TrainerState(max_steps=100_000, is_world_process_zero=True)
    bar.on_train_begin(args, state, TrainerControl())
    assert (bar.training_bar.total, bar.training_bar.n, bar.training_bar.unit) == (27, 0, "min")
    clock.elapsed, state.global_step = 13.5 * 60, 2000
    bar.on_step_end(args, state, TrainerControl())
    assert bar.training_bar.n == 13.5 and "step 2000" in str(bar.training_bar)
    assert "13.5/27.0 min" in str(bar.training_bar) and "100000" not in str(bar.training_bar)
    bar.on_train_end(args, state, TrainerControl())
    # Without a budget: transformers' bar over max_steps.
    plain = BudgetProgressCallback(WallClockCallback())
    plain.on_train_begin(args, TrainerState(max_steps=40, is_world_process_zero=True), TrainerControl())
    assert plain.training_bar.total == 40
    plain.on_train_end(args, state, TrainerControl())


def test_the_curves_after_a_resume_hold_every_logged_step_from_before_it(tmp_path, monkeypatch):
    from conftest import make_model, one_sgd_step_arguments, uneven_pairs
    from transformers import Seq2SeqTrainer

    from vaswani_mt.training import callbacks

    drawn = []
    monkeypatch.setattr(
        callbacks, "plot_curves", lambda history, *a, **k: drawn.append([r["step"] for r in history if "loss" in r])
    )
    for steps, resume in ((3, None), (6, str(tmp_path / "checkpoint-3"))):  # the second run: a new process's callback
        arguments = one_sgd_step_arguments(tmp_path, per_device=1, max_steps=steps, learning_rate=0.01)
        arguments.save_strategy, arguments.save_steps = "steps", 3
        trainer = Seq2SeqTrainer(model=make_model(seed=0), args=arguments, train_dataset=uneven_pairs(),
                                 callbacks=[callbacks.CurvesCallback()])  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
    assert drawn[-1] == [1, 2, 3, 4, 5, 6]


def test_the_curves_are_redrawn_at_a_save_at_most_once_a_minute_and_always_at_the_end(monkeypatch):
    from types import SimpleNamespace

    from vaswani_mt.training import callbacks

    drawn, clock = [], [0.0]
    monkeypatch.setattr(callbacks, "plot_curves", lambda history, *a, **k: drawn.append(clock[0]))
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    args = SimpleNamespace(output_dir="out", metric_for_best_model=None)
    state = SimpleNamespace(is_world_process_zero=True, log_history=[], best_global_step=None)
    curves = callbacks.CurvesCallback()
    for clock[0] in (100.0, 130.0, 159.0, 160.0, 170.0):  # saves: the first draws, then once 60 s have passed
        curves.on_save(args, state, None)
    curves.on_train_end(args, state, None)
    assert drawn == [100.0, 160.0, 170.0]


def test_plot_has_a_panel_per_logged_curve(tmp_path):
    history = [
        {"step": s, "loss": 5 - s / 10, "learning_rate": 1e-3, "target_tokens_per_second": 900} for s in range(5)
    ]
    path = plot_curves(history, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a run shorter than --logging_steps logs only its end: its mean loss is drawn, as one point
    short = [{"step": 9, "train_runtime": 3.1, "train_loss": 6.5}]
    assert plot_curves(short, tmp_path / "short.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_step_with_a_checkpoint_and_a_second_one_is_not_caught(signum, code):
    preemption = PreemptionCallback()
    before = signal.getsignal(signum)
    caught = []

    def stand_in(*_):  # for the default handler, which stops at once
        caught.append(signum)

    signal.signal(signum, stand_in)
    try:
        with preemption.catching_signals():
            assert not preemption.on_step_end(None, TrainerState(global_step=7), TrainerControl()).should_save
            os.kill(os.getpid(), signum)  # handled between two bytecodes: here, at once
            assert preemption.signal_name == signal.Signals(signum).name and preemption.exit_code == code
            control = preemption.on_step_end(None, TrainerState(global_step=8), TrainerControl())
            assert control.should_save and control.should_training_stop and preemption.stopped_at_step == 8
            os.kill(os.getpid(), signum)  # the second one reaches the handler that was there before
            assert caught == [signum]
            assert signal.getsignal(signum) is stand_in
        assert signal.getsignal(signum) is stand_in  # the block's end leaves the old handler in place
    finally:
        signal.signal(signum, before)


def test_under_a_launcher_the_same_signal_twice_at_once_is_one(monkeypatch):
    """Slurm signals every process of a job, and torchrun passes the signal on to its workers: a worker gets it
    twice within milliseconds. The copy is not the user's second signal: the step still ends with a checkpoint."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    preemption = PreemptionCallback()
    assert preemption.echo_seconds == 2.0 and PreemptionCallback(echo_seconds=0).echo_seconds == 0
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert PreemptionCallback().echo_seconds == 0.0  # outside a launcher, a second signal stops at once
    before, caught = signal.getsignal(signal.SIGTERM), []
    signal.signal(signal.SIGTERM, lambda *_: caught.append("stopped at once"))
    try:
        with preemption.catching_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the launcher's copy
            assert caught == [] and preemption.signal_name == "SIGTERM"
            assert preemption.on_step_end(None, TrainerState(global_step=3), TrainerControl()).should_save
            preemption._first_signal_at -= 2.0  # two seconds later: a signal of its own
            os.kill(os.getpid(), signal.SIGTERM)
            assert caught == ["stopped at once"]
    finally:
        signal.signal(signal.SIGTERM, before)
