"""The integrations against a live Concord (uvicorn, the real stores and worker): the typed
client, the LangChain retriever under LangChain's standard retriever tests, the LlamaIndex
retriever, and the MCP server through the official SDK's client over Streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass

import httpx
import httpx2
import pytest
from concord_client import (
    AsyncConcord,
    AuthenticationError,
    Concord,
    NotFound,
    PermissionDenied,
)
from concord_client.langchain import ConcordRetriever
from concord_client.llamaindex import ConcordLlamaIndexRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.helpers import new_key, wait_converged

DOCS = {
    "kettle.md": (
        "Household",
        "# Kettle\n\nDescale an electric kettle with equal parts white vinegar and water, "
        "boil it, leave it for an hour, then rinse it several times.",
    ),
    "okapi.txt": (
        "Forest animals",
        "The okapi lives only in the Ituri rainforest. Its legs carry white stripes like a "
        "zebra's, yet its closest relative is the giraffe.",
    ),
    "pump.txt": (
        "Pump manual",
        "Fault code XQ-4471-B means the impeller is blocked. Switch the pump off before you "
        "clear it.",
    ),
    "bees.txt": (
        "Insects",
        "Honey bees tell each other where flowers are with the waggle dance.",
    ),
}


@dataclass(frozen=True)
class Live:
    url: str
    tenant: str
    write_key: str
    read_key: str
    ids: dict[str, str]


@pytest.fixture(scope="module")
def live(live_api: str, worker) -> Live:
    """A tenant with four documents uploaded and indexed through the typed client."""
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    write_key = new_key(tenant, ["read", "write"])
    ids = {}
    with Concord(live_api, write_key) as client:
        jobs = []
        for external_id, (title, text) in DOCS.items():
            if external_id.endswith(".md"):  # a file, as multipart
                accepted = client.upload_file(text.encode(), filename=external_id, title=title)
            else:
                accepted = client.upload_text(external_id, text, title=title)
            assert accepted.status == "accepted"
            ids[external_id] = str(accepted.document_id)
            jobs.append(accepted.job_id)
        for job_id in jobs:
            assert client.wait_for_job(job_id, timeout=120).state == "indexed"
    wait_converged(tenant)
    return Live(live_api, tenant, write_key, new_key(tenant, ["read"]), ids)


# -- the typed client ---------------------------------------------------------------------


def test_the_client_reads_searches_and_pages_through_the_live_api(live: Live):
    with Concord(live.url, live.read_key) as client:
        response = client.search("how do I descale a kettle", top_k=2)
        assert response.results[0].external_id == "kettle.md"
        assert response.decision.status in ("answerable", "verify")

        pages = list(client.search_pages("kettle okapi pump bees", top_k=2))
        paged = [r.chunk_id for page in pages for r in page.results]
        assert len(pages) >= 2 and len(paged) == len(set(paged)) >= 4

        assert sorted(d.external_id for d in client.iter_documents(page_size=3)) == sorted(DOCS)
        document = client.get_document(live.ids["pump.txt"])
        assert document.title == "Pump manual" and document.elasticsearch.in_sync
        chunks = client.document_chunks(live.ids["pump.txt"])
        assert "XQ-4471-B" in chunks.chunks[0].text


def test_the_clients_errors_carry_the_servers_answer(live: Live):
    with (
        Concord(live.url, live.read_key) as reader,
        pytest.raises(PermissionDenied, match="write"),
    ):
        reader.upload_text("x", "a read key cannot write")
    other = new_key(f"t-{uuid.uuid4().hex[:12]}", ["read"])
    with Concord(live.url, other) as stranger:
        with pytest.raises(NotFound) as raised:
            stranger.get_document(live.ids["pump.txt"])
        assert raised.value.code == "not_found"
        assert stranger.search("impeller blocked fault code").results == []
    with Concord(live.url, "ck_" + "x" * 40) as nobody, pytest.raises(AuthenticationError):
        nobody.search("kettle")


def test_the_async_client_searches_and_lists(live: Live):
    async def main() -> None:
        async with AsyncConcord(live.url, live.read_key) as client:
            response = await client.search("Ituri rainforest", top_k=1)
            assert response.results[0].external_id == "okapi.txt"
            listed = [d.external_id async for d in client.iter_documents(page_size=2)]
            assert sorted(listed) == sorted(DOCS)

    asyncio.run(main())


# -- framework retrievers ------------------------------------------------------------------


class TestLangChainRetrieverStandard(RetrieversIntegrationTests):
    """LangChain's own retriever test suite (langchain-tests), against the live tenant."""

    @pytest.fixture(autouse=True)
    def _live(self, live: Live) -> None:
        self.live = live

    @property
    def retriever_constructor(self) -> type[ConcordRetriever]:
        return ConcordRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"base_url": self.live.url, "api_key": self.live.read_key, "k": 2}

    @property
    def retriever_query_example(self) -> str:
        return "how do I descale a kettle"


def test_langchain_documents_carry_concords_provenance(live: Live):
    retriever = ConcordRetriever(base_url=live.url, api_key=live.read_key, k=1)
    [document] = retriever.invoke("what does fault code XQ-4471-B mean")
    assert "impeller" in document.page_content
    assert document.metadata["external_id"] == "pump.txt"
    assert document.metadata["document_id"] == live.ids["pump.txt"]
    assert document.metadata["title"] == "Pump manual"
    assert document.metadata["decision"] in ("answerable", "verify")
    assert document.id == document.metadata["chunk_id"]


def test_the_llamaindex_retriever_runs_a_real_query(live: Live):
    with Concord(live.url, live.read_key) as client:
        retriever = ConcordLlamaIndexRetriever(client, top_k=2)
        nodes = retriever.retrieve("where does the okapi live")
    assert len(nodes) == 2
    best = nodes[0]
    assert "Ituri" in best.node.get_content()
    assert best.node.metadata["external_id"] == "okapi.txt"
    assert best.score == pytest.approx(best.node.metadata["score"])
    assert best.node.node_id == best.node.metadata["chunk_id"]


# -- MCP -----------------------------------------------------------------------------------


async def _mcp(url: str, key: str, steps):
    """Run ``steps(session)`` in an MCP session with the official SDK's client."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return await steps(session)


def _payload(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


class ServerErrors(logging.Handler):
    """Records logged at ERROR or above while it is attached to the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_mcp_client_lists_the_tools_and_calls_each(live: Live):
    async def steps(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {
            "search",
            "fetch_chunk",
            "fetch_document",
            "list_documents",
            "get_job",
            "add_document",
        }
        assert tools["search"].input_schema["required"] == ["query"]
        assert tools["search"].annotations.read_only_hint is True

        found = _payload(await session.call_tool("search", {"query": "descale a kettle"}))
        assert found["decision"] in ("answerable", "verify")
        passage = found["passages"][0]
        assert passage["external_id"] == "kettle.md" and passage["title"] == "Household"
        assert passage["section"] and passage["chunk_id"]

        window = _payload(
            await session.call_tool(
                "fetch_chunk",
                {"document_id": passage["document_id"], "chunk_id": passage["chunk_id"]},
            )
        )
        assert passage["chunk_id"] in [c["chunk_id"] for c in window["chunks"]]

        document = _payload(
            await session.call_tool("fetch_document", {"document_id": live.ids["okapi.txt"]})
        )
        assert "Ituri rainforest" in document["text"] and not document["truncated"]

        listed = _payload(await session.call_tool("list_documents", {"limit": 3}))
        assert len(listed["documents"]) == 3 and listed["next_after"]

        added = _payload(
            await session.call_tool(
                "add_document",
                {"external_id": "mcp-note", "text": "Added through MCP.", "title": "Note"},
            )
        )
        assert added["status"] == "accepted"
        job = _payload(await session.call_tool("get_job", {"job_id": added["job_id"]}))
        assert job["document_id"] == added["document_id"]

        [template] = (await session.list_resource_templates()).resource_templates
        assert template.uri_template == "concord://documents/{document_id}"
        read = await session.read_resource(f"concord://documents/{live.ids['okapi.txt']}")
        assert read.contents[0].text.startswith("# Forest animals\n\nThe okapi lives")

    asyncio.run(_mcp(live.url, live.write_key, steps))


def test_mcp_keeps_the_keys_scopes_and_tenant(live: Live):
    async def as_reader(session: ClientSession) -> None:
        refused = await session.call_tool("add_document", {"external_id": "x", "text": "no"})
        assert refused.is_error
        assert "403" in refused.content[0].text and "write" in refused.content[0].text

    asyncio.run(_mcp(live.url, live.read_key, as_reader))

    stranger = new_key(f"t-{uuid.uuid4().hex[:12]}", ["read", "write"])
    theirs = live.ids["pump.txt"]

    async def as_stranger(session: ClientSession) -> None:
        found = _payload(await session.call_tool("search", {"query": "impeller fault code"}))
        assert found["passages"] == [] and found["decision"] == "abstain"
        for name, arguments in [
            ("fetch_document", {"document_id": theirs}),
            ("fetch_chunk", {"document_id": theirs, "chunk_id": "any"}),
        ]:
            result = await session.call_tool(name, arguments)
            assert result.is_error and "404" in result.content[0].text
        with pytest.raises(MCPError, match="not found"):
            await session.read_resource(f"concord://documents/{theirs}")

    asyncio.run(_mcp(live.url, stranger, as_stranger))


def test_bad_input_through_mcp_is_a_clear_error_and_no_server_error(live: Live):
    errors = ServerErrors()
    logging.getLogger().addHandler(errors)
    try:

        async def steps(session: ClientSession) -> None:
            malformed = await session.call_tool("search", {"query": "kettle", "top_k": "many"})
            assert malformed.is_error and "top_k" in malformed.content[0].text
            missing = await session.call_tool("fetch_document", {})
            assert missing.is_error and "document_id" in missing.content[0].text
            unknown = await session.call_tool("drop_everything", {})
            assert unknown.is_error and "Unknown tool" in unknown.content[0].text
            too_long = await session.call_tool("search", {"query": "k" * 5000})
            assert too_long.is_error and "query" in too_long.content[0].text
            # a filter without its "metadata" level: the client's own check, as a tool error
            shapeless = await session.call_tool(
                "search", {"query": "kettle", "filters": {"team": "ops"}}
            )
            assert shapeless.is_error and "filters" in shapeless.content[0].text
            sneaky = await session.call_tool("fetch_document", {"document_id": "../../mcp"})
            assert sneaky.is_error and "document_id" in sneaky.content[0].text

        asyncio.run(_mcp(live.url, live.read_key, steps))

        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        accept = {"Accept": "application/json, text/event-stream"}
        oversized = httpx.post(
            f"{live.url}/mcp",
            headers={"Authorization": f"Bearer {live.read_key}", **accept},
            json={**rpc, "params": {"padding": "x" * (2 * 1024 * 1024)}},
            timeout=60,
        )
        assert oversized.status_code == 413
        assert oversized.json()["error"]["code"] == "payload_too_large"

        anonymous = httpx.post(f"{live.url}/mcp", headers=accept, json=rpc, timeout=60)
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        assert json.loads(anonymous.text)["error"]["code"] == "unauthorized"
    finally:
        logging.getLogger().removeHandler(errors)
    assert [r.getMessage() for r in errors.records] == []


def test_concord_mcp_stdio_serves_the_tools_to_a_desktop_assistant(live: Live):
    """``concord mcp --stdio``, started as an assistant starts it, with the key in its
    environment: the same tools, calling the live API over HTTP."""
    concord = os.path.join(os.path.dirname(sys.executable), "concord")
    server = StdioServerParameters(
        command=concord,
        args=["mcp", "--stdio", "--url", live.url],
        env={**os.environ, "CONCORD_API_KEY": live.read_key},
    )

    async def main() -> None:
        async with (
            stdio_client(server) as (read, write, *_),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert len((await session.list_tools()).tools) == 6
            found = _payload(await session.call_tool("search", {"query": "waggle dance"}))
            assert found["passages"][0]["external_id"] == "bees.txt"
            refused = await session.call_tool("add_document", {"external_id": "x", "text": "y"})
            assert refused.is_error and "403" in refused.content[0].text

    asyncio.run(main())


def test_concord_mcp_without_stdio_says_where_the_api_serves_it():
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "concord"), "mcp"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "/mcp" in done.stderr and "--stdio" in done.stderr
    assert "Traceback" not in done.stderr


INSPECTOR = os.path.join(
    os.path.dirname(os.path.dirname(sys.executable)),
    "mcp-inspector",
    "node_modules",
    ".bin",
    "mcp-inspector",
)


def _inspector(live: Live, key: str, *arguments: str, tool_error: bool = False) -> dict:
    """One call of the MCP Inspector's command line (scripts/setup.sh installs it from npm);
    it exits 5 for a tool's error result, which it prints as for any other."""
    done = subprocess.run(
        [
            INSPECTOR,
            "--cli",
            f"{live.url}/mcp",
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {key}",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == (5 if tool_error else 0), done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_mcp_inspector_lists_the_tools_and_calls_them(live: Live):
    """A second real client, the one MCP's authors ship for trying a server by hand."""
    assert os.path.exists(INSPECTOR), "scripts/setup.sh installs the MCP Inspector (needs npm)"
    listed = _inspector(live, live.read_key, "--method", "tools/list")
    assert {tool["name"] for tool in listed["tools"]} >= {"search", "fetch_document"}

    found = _inspector(
        live,
        live.read_key,
        "--method",
        "tools/call",
        "--tool-name",
        "search",
        "--tool-arg",
        "query=what does fault code XQ-4471-B mean",
    )
    assert found["structuredContent"]["passages"][0]["external_id"] == "pump.txt"

    refused = _inspector(
        live,
        live.read_key,
        "--method",
        "tools/call",
        "--tool-name",
        "add_document",
        "--tool-arg",
        "external_id=x",
        "--tool-arg",
        "text=a read key cannot write",
        tool_error=True,
    )
    assert refused["isError"] is True and "403" in refused["content"][0]["text"]
