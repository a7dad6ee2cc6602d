"""The evaluation harness: ``concord eval`` and ``concord tune`` over BEIR-format datasets,
measured through Concord's real ingest pipeline and search service."""
