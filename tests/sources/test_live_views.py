"""book/_ext/live_views.py: the model files a page's live views name are copied into the
English site's _static/live/ (only the served ones), a missing one fails the build with the
page's name, and every page's course-live-root points at the English build's folder."""

import importlib.util
from pathlib import Path

import pytest
from sphinx.errors import ExtensionError

from transformer_course.viz.live import live_view_html

EXT = Path(__file__).resolve().parents[2] / "book" / "_ext" / "live_views.py"


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("live_views", EXT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = {
    "model": "minilm-0123456789abcdef/encoder.onnx",
    "vocab": "minilm-0123456789abcdef/vocab.json",
    "n_layers": 6,
    "n_heads": 12,
    "max_len": 128,
    "example": 'It\'s "quoted".',
}


def site(tmp_path: Path, config=CONFIG) -> tuple[Path, Path]:
    out, live = tmp_path / "html", tmp_path / "live"
    (out / "book").mkdir(parents=True)
    page = f"<html><body>{live_view_html('minilm', config, '<p>old</p>')}</body></html>"
    (out / "book" / "03_multi_head.html").write_text(page, "utf-8")
    (out / "book" / "01_qkv.html").write_text("<html>no view</html>", "utf-8")
    folder = live / "minilm-0123456789abcdef"
    folder.mkdir(parents=True)
    for name in ("encoder.onnx", "vocab.json", "state_dict.pt", "config.json"):
        (folder / name).write_bytes(b"x" * 10)
    return out, live


def test_served_files_are_copied_and_only_those(ext, tmp_path):
    out, live = site(tmp_path)
    assert ext.referenced(out) == {
        "book/03_multi_head.html": [CONFIG["model"], CONFIG["vocab"]]
    }
    assert ext.publish(out, live, chinese=False) == sorted(
        [CONFIG["model"], CONFIG["vocab"]]
    )
    copied = sorted(
        p.name for p in (out / "_static/live/minilm-0123456789abcdef").iterdir()
    )
    assert copied == ["encoder.onnx", "vocab.json"]


def test_the_chinese_build_copies_into_the_english_sites_folder(ext, tmp_path):
    """The Chinese pages (outdir html/zh) may name an export the English pages do not (their
    chapters executed apart): it lands in html/_static/live/, where their meta points."""
    out, live = site(tmp_path)
    zh = out / "zh"
    (out / "book").rename(zh)
    ext.publish(zh, live, chinese=True)
    assert not (zh / "_static").exists()
    assert (out / "_static/live/minilm-0123456789abcdef/encoder.onnx").is_file()


def test_the_english_build_skips_the_chinese_pages_and_drops_stale_folders(
    ext, tmp_path
):
    out, live = site(tmp_path)
    stale = out / "_static/live/minilm-ffffffffffffffff"
    stale.mkdir(parents=True)
    zh = out / "zh"  # a Chinese page of an earlier build, naming a missing export
    zh.mkdir()
    (zh / "03_multi_head.html").write_text(
        live_view_html(
            "minilm", dict(CONFIG, model="minilm-eeeeeeeeeeeeeeee/encoder.onnx"), "x"
        ),
        "utf-8",
    )
    ext.publish(out, live, chinese=False)  # no error: the zh build checks its own pages
    assert not stale.exists()
    assert (out / "_static/live/minilm-0123456789abcdef").is_dir()
    with pytest.raises(ExtensionError, match="eeeeeeeeeeeeeeee"):
        ext.publish(zh, live, chinese=True)


def test_a_missing_file_fails_the_build_naming_the_page(ext, tmp_path):
    out, live = site(
        tmp_path, dict(CONFIG, model="minilm-ffffffffffffffff/encoder.onnx")
    )
    with pytest.raises(
        ExtensionError, match="book/03_multi_head.html.*ffffffffffffffff"
    ):
        ext.publish(out, live, chinese=False)


def test_a_path_out_of_the_folder_is_refused(ext, tmp_path):
    out, live = site(tmp_path, dict(CONFIG, model="../../etc/encoder.onnx"))
    with pytest.raises(ExtensionError, match="does not exist"):
        ext.publish(out, live, chinese=False)


def test_live_root_points_at_the_english_static_folder(ext):
    assert ext.live_root("book/03_multi_head", chinese=False) == "../_static/live/"
    assert ext.live_root("intro", chinese=False) == "_static/live/"
    assert ext.live_root("03_multi_head", chinese=True) == "../_static/live/"  # zh/...
    assert ext.live_root("book/a/b", chinese=False) == "../../_static/live/"
