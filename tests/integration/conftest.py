"""Fixtures the integration tiers share: a small corpus indexed through the real worker, and
a cross-encoder built on the spot (no weights can be downloaded here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from shared.settings import get_settings
from tests.helpers import upload_text, wait_converged, wait_job

DOCS = {
    "okapi": (
        "Forest animals",
        "The okapi lives only in the Ituri rainforest. Its legs carry "
        "white stripes like a zebra's, yet its closest relative is the giraffe.",
        {"team": "zoo", "year": 2019, "published": "2019-05-01"},
    ),
    "pump": (
        "Pump manual",
        "Fault code XQ-4471-B means the impeller is blocked. Switch the "
        "pump off before you clear it.",
        {"team": "ops", "year": 2021, "published": "2021-02-11"},
    ),
    "kettle": (
        "Household",
        "Descale an electric kettle with vinegar and water, then rinse it.",
        {"team": "home", "year": 2022, "published": "2022-09-30"},
    ),
    "bees": (
        "Insects",
        "Honey bees tell each other where flowers are with the waggle dance.",
        {"team": "zoo", "year": 2023, "published": "2023-07-15"},
    ),
}


@pytest.fixture
def corpus(client: TestClient, auth, tenant, worker) -> dict[str, str]:
    ids = {}
    for external_id, (title, text, metadata) in DOCS.items():
        up = upload_text(client, auth, external_id, text, title=title, metadata=metadata)
        ids[external_id] = up["document_id"]
        wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    return ids


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A cross-encoder the test builds itself (no weights can be downloaded here): its scores
    mean nothing, but it runs the real CrossEncoder code path."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from shared.ingest.embedding import get_embedder

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(get_embedder().model_path)
    config = BertConfig(  # type: ignore[call-arg]
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
        max_position_embeddings=512,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


@pytest.fixture
def cross_encoder_configured(tiny_cross_encoder, monkeypatch):
    settings = get_settings()
    monkeypatch.setattr(settings, "rerank_kind", "cross-encoder")
    monkeypatch.setattr(settings, "rerank_model", str(tiny_cross_encoder))
    monkeypatch.setattr(settings, "rerank_max_length", 32)
    monkeypatch.setattr(settings, "rerank_batch_size", 4)
    return settings
