"""Resolve: the request as the search will run it (its profile applied) and the tenant's
models it names (a trained reranker, an answerability model), read from the primary before
any store is searched: an unknown name is a 404 at once."""

from __future__ import annotations

from sqlalchemy.orm import Session

from shared.answerability import service as answerability
from shared.db import Transactions
from shared.errors import BadRequest, Conflict, NotFound
from shared.rerankers import service as rerankers
from shared.search.calibration import calibrated_min_score
from shared.search.profiles import resolve_profile
from shared.search.schemas import SearchRequest
from shared.search.values import Query
from shared.settings import Settings


def resolve(
    transactions: Transactions,
    tenant_id: str,
    request: SearchRequest,
    *,
    settings: Settings,
    embedding_cache: bool = True,
) -> Query:
    """The search's :class:`Query`. Reads Postgres when the request names a profile or a
    model (most searches name none), and for the tenant's calibrated threshold at most once
    a minute per process (calibration.py)."""
    trained_reranker: str | None = None
    judge: answerability.LoadedModel | None = None
    if (
        request.profile is not None
        or request.rerank.model is not None
        or request.policy.score_type == "answerability"
    ):
        with transactions() as uow:
            if request.profile is not None:
                request = resolve_profile(uow.session, tenant_id, request)
            if request.policy.score_type == "answerability":
                judge = answerability_model(uow.session, tenant_id, request)
            if request.rerank.enabled and request.rerank.model is not None:
                entry = rerankers.get(uow.session, tenant_id, request.rerank.model)
                trained_reranker = entry.path
                if request.rerank.blend is None:
                    blend = entry.card.get("validation", {}).get("blend", 1.0)
                    request = request.model_copy(
                        update={"rerank": request.rerank.model_copy(update={"blend": blend})}
                    )
    if request.paginate and (request.rerank.enabled or request.mmr is not None):
        raise BadRequest(
            "paginate follows the fused ranking page by page; rerank and mmr reorder only a "
            "window of the first page: turn them off to paginate"
        )
    calibrated = None
    if (
        settings.policy_calibration
        and request.policy.min_score is None
        and request.policy.score_type in (None, "dense_cosine")
    ):
        calibrated = calibrated_min_score(transactions, tenant_id)
    return Query(tenant_id, request, settings, judge, trained_reranker, embedding_cache, calibrated)


def answerability_model(
    session: Session, tenant_id: str, request: SearchRequest
) -> answerability.LoadedModel:
    """The tenant's answerability model the request names (404 if it has none by that name,
    or if the reranker it reads is gone; 409 if that reranker was trained again since); its
    features are both arms' scores, so only a hybrid search can use it."""
    if request.mode != "hybrid":
        raise BadRequest(
            'policy.score_type "answerability" needs mode "hybrid": the model judges both '
            f"arms' scores, and a {request.mode} search runs one"
        )
    name = request.policy.answerability_model or answerability.DEFAULT_MODEL
    judge = answerability.load(answerability.get(session, tenant_id, name))
    if judge.reranker is None:
        return judge
    try:
        files = rerankers.get(session, tenant_id, judge.reranker).path
    except NotFound as e:
        raise NotFound(
            f"answerability model {name!r} reads the scores of reranker {judge.reranker!r}, "
            "which this tenant no longer has: train the model again"
        ) from e
    if files != judge.reranker_files:
        raise Conflict(
            f"answerability model {name!r} was trained on the scores of an earlier training "
            f"of reranker {judge.reranker!r}: train the model again"
        )
    return judge
