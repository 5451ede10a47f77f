"""The operator image by digest (issue 18): ``image.digest`` wins over the tag."""

from __future__ import annotations

import helm_python as helm
import pytest

from tests.chart.helpers import one, render


def test_image_by_digest() -> None:
    digest = "sha256:" + "ab" * 32
    deployment = one(render({"image": {"digest": digest, "tag": "ignored"}}), "Deployment")
    [main] = deployment["spec"]["template"]["spec"]["containers"]
    assert main["image"] == f"trainjob-operator@{digest}"
    [default] = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "@" not in default["image"]


@pytest.mark.parametrize("digest", ["latest", "sha256:abc", "sha512:" + "ab" * 64])
def test_schema_refuses_what_is_not_a_sha256_digest(digest: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render({"image": {"digest": digest}})
    assert "/image/digest" in str(raised.value)
