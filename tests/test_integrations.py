"""The Hugging Face Trainer and Lightning callbacks on real trainers with tiny models built from a
config (random data, nothing downloaded): the right steps, samples and tokens per step, and each
step's loss equal to the loss the framework itself logged for it."""
from __future__ import annotations

import logging

import pytest
import torch

import neuron_prof
from neuron_prof.analysis.metrics import series

STEPS, BATCH, ACCUMULATE, SEQ = 5, 4, 2, 16


def test_hugging_face_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from neuron_prof.integrations.huggingface import NeuronProfCallback
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (STEPS * BATCH * ACCUMULATE, SEQ))
    data = [{"input_ids": x, "labels": x} for x in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
        include_num_input_tokens_seen=True, disable_tqdm=True, dataloader_num_workers=0, learning_rate=1e-3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[NeuronProfCallback(tmp_path / "run")])
    trainer.train()
    run = neuron_prof.load(tmp_path / "run")
    steps = run.steps
    assert steps[steps["complete"]]["step"].tolist() == list(range(STEPS))  # step N: global_step N+1
    logged = [x["loss"] for x in trainer.state.log_history if "loss" in x]
    assert len(logged) == STEPS
    assert series(run.metrics, "loss").tolist() == pytest.approx(logged, rel=1e-5)
    assert series(run.metrics, "samples").tolist() == [BATCH * ACCUMULATE] * STEPS
    assert series(run.metrics, "tokens").tolist() == [BATCH * ACCUMULATE * SEQ] * STEPS


def test_lightning_trainer(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from neuron_prof.integrations.lightning import NeuronProfCallback

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            self.losses: list[float] = []  # what training_step returned, batch by batch

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * ACCUMULATE * BATCH, 8),
                                          torch.randn(STEPS * ACCUMULATE * BATCH, 1))
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    trainer = pl.Trainer(max_steps=STEPS, accumulate_grad_batches=ACCUMULATE, accelerator="cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[NeuronProfCallback(tmp_path / "run")])
    module = Regression()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
    run = neuron_prof.load(tmp_path / "run")
    steps = run.steps
    assert steps[steps["complete"]]["step"].tolist() == list(range(STEPS))
    # Lightning divides each batch's loss by accumulate_grad_batches before backward(): the step's
    # loss is the mean of its batches' losses
    raw = module.losses
    per_step = [sum(raw[i:i + ACCUMULATE]) / ACCUMULATE for i in range(0, len(raw), ACCUMULATE)]
    assert series(run.metrics, "loss").tolist() == pytest.approx(per_step, rel=1e-6)
    assert series(run.metrics, "samples").tolist() == [BATCH * ACCUMULATE] * STEPS


def test_under_record_a_callback_leaves_the_steps_to_the_running_capture(tmp_path, caplog):
    pytest.importorskip("transformers")
    from neuron_prof.integrations.huggingface import NeuronProfCallback
    with neuron_prof.profile(tmp_path / "outer"):
        callback = NeuronProfCallback(tmp_path / "inner")
        with caplog.at_level(logging.WARNING, logger="neuron_prof"):
            callback.capture.start()
        callback.capture.step(samples=1)
        callback.capture.stop()
    assert "leaves the steps to that capture" in caplog.text
    assert not (tmp_path / "inner").exists()
