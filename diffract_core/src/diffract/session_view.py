"""Views of a session: some models, and within them some parameters
(``session.filter(...)``), with the same ``compute`` and ``results`` API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from diffract.compute import ComputeAPI
from diffract.core.scope import Scope
from diffract.errors import UnknownModelError
from diffract.results import ResultsAPI

if TYPE_CHECKING:  # pragma: no cover
    from diffract.session import Session

__all__ = ["SessionView"]


class SessionView:
    """A session seen through a :class:`~diffract.core.scope.Scope`: ``compute`` and
    ``results`` act on its models and parameters only. Usable as a context manager
    (leaving it does not close the session); ``filter`` narrows it further."""

    def __init__(self, session: Session, scope: Scope) -> None:
        self.session = session
        self.scope = scope
        self.compute = ComputeAPI(session, scope)
        self.results = ResultsAPI(session, scope)

    @property
    def model_ids(self) -> list[str]:
        """The models in this view, in its order."""
        return self.scope.model_ids(self.session.store)

    def filter(
        self,
        model_ids: Sequence[str] | str | None = None,
        *,
        param_names: Sequence[str] | str | None = None,
        param_types: Sequence[Any] | Any | None = None,
        param_ids: Sequence[str] | str | None = None,
    ) -> SessionView:
        """This view narrowed by more filters (see :meth:`Session.filter`)."""
        ids = None
        if model_ids is not None:
            ids = self.session._check_ids(model_ids)
            outside = [m for m in ids if m not in self.model_ids]
            if outside:
                raise UnknownModelError(
                    f"Model id(s) {outside} are outside this view's scope {self.model_ids}.",
                    model_id=outside[0])
        return SessionView(self.session,
                           self.scope.narrow(ids, param_names, param_types, param_ids))

    def __enter__(self) -> SessionView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"SessionView({self.scope.describe()})"
