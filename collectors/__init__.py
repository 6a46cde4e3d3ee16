"""Event sources, one module each. A collector knows only the recording API
(``neuron_prof.recording``: the Recorder it writes to, ``torchhooks`` for the callbacks it hands
torch), the tables it writes (``neuron_prof.store.schema``) and what a backend is
(``neuron_prof.backends``); never the session, another collector, an analysis or an exporter.

``REGISTRY`` maps the names users pass to ``profile(collectors=...)`` / ``--collectors`` to
collector classes; importing a collector must not import torch extensions until ``install``.

May import: recording, backends, store.
"""
from __future__ import annotations

from neuron_prof.collectors.collectives import CollectivesCollector
from neuron_prof.collectors.compiler import CompilerCollector
from neuron_prof.collectors.device import DeviceCollector
from neuron_prof.collectors.eager import EagerCollector
from neuron_prof.collectors.loss import LossCollector
from neuron_prof.collectors.memory import MemoryCollector

REGISTRY = {
    EagerCollector.name: EagerCollector,
    CompilerCollector.name: CompilerCollector,
    MemoryCollector.name: MemoryCollector,
    CollectivesCollector.name: CollectivesCollector,
    DeviceCollector.name: DeviceCollector,
    LossCollector.name: LossCollector,
}
