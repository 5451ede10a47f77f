"""The TrainJob resource: its metadata, spec and status in one model."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from trainjob_operator.api.fields import ApiModel, api_error
from trainjob_operator.api.spec import TrainJobSpec
from trainjob_operator.api.status import TrainJobStatus
from trainjob_operator.constants import KIND

__all__ = ["MAX_NAME_LENGTH", "ObjectMeta", "TrainJob"]

MAX_NAME_LENGTH = 40
"""Longest TrainJob name accepted: child objects append suffixes such as ``-s0-h15`` and
``-headless`` and must stay within the 63-character DNS label limit."""

_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NAME_RE = re.compile(_NAME_PATTERN)
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ObjectMeta(BaseModel):
    """The subset of Kubernetes ObjectMeta the TrainJob tooling reads; other fields are kept."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        extra="allow",
    )

    name: str = Field(description="Object name; also the prefix of every child object.")
    namespace: str | None = Field(
        default=None, description="Namespace (the current one when omitted)."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    uid: str | None = Field(default=None, description="Set by the API server.")
    generation: int | None = Field(default=None, description="Set by the API server.")
    resource_version: str | None = Field(default=None, description="Set by the API server.")
    creation_timestamp: str | None = Field(default=None, description="Set by the API server.")

    @model_validator(mode="after")
    def _check_name(self) -> ObjectMeta:
        if len(self.name) > MAX_NAME_LENGTH:
            raise api_error(
                f"name {self.name!r} is {len(self.name)} characters long; at most "
                f"{MAX_NAME_LENGTH} are allowed",
                hint="child pods and services append suffixes and must fit in 63 characters",
                field="name",
            )
        if not _NAME_RE.match(self.name):
            raise api_error(
                f"name {self.name!r} must consist of lowercase letters, digits and '-', start "
                "with a letter and end with a letter or digit",
                field="name",
            )
        return self

    @model_validator(mode="after")
    def _check_namespace(self) -> ObjectMeta:
        namespace = self.namespace
        if namespace is not None and (len(namespace) > 63 or not _NAMESPACE_RE.match(namespace)):
            raise api_error(
                f"namespace {namespace!r} is not a valid namespace name",
                hint="at most 63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit",
                field="namespace",
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible camelCase dict without ``None`` fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class TrainJob(ApiModel):
    """A distributed training job on Ray: train function, workers, checkpoints, validation."""

    api_version: Literal["trainjob.dev/v1alpha1"] = Field(
        default="trainjob.dev/v1alpha1", description="trainjob.dev/v1alpha1"
    )
    kind: Literal["TrainJob"] = Field(default=KIND, description=KIND)
    metadata: ObjectMeta
    spec: TrainJobSpec
    status: TrainJobStatus | None = None

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return self.metadata.name
