"""The demo's Azure scene plays and checks itself (local ARM, no lab needed)."""

from __future__ import annotations

import io

from rich.console import Console

from demo import SceneContext
from demo.azure import SCENE
from tests.arm.armtest import ROOT, TRANSCRIPT


def test_azure_scene_shows_what_it_should() -> None:
    buffer = io.StringIO()
    ctx = SceneContext(console=Console(file=buffer, width=160), root=ROOT, lab=None, hosts=0)  # type: ignore[arg-type]
    assert SCENE.run(ctx) is True, buffer.getvalue()[-3000:]
    text = buffer.getvalue()
    TRANSCRIPT.append(text)
    assert "$ invoke quota.request --location eastus --family standardNDSv2Family --vcpus 96 --yes" in text
    assert "(exit 5)" in text
