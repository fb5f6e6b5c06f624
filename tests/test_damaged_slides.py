"""A slide copied only in part: its first pages are there, its later levels are lost."""

from __future__ import annotations

import pytest
import test_slides  # the slide fixtures (tests/ is on the path, as pytest imports tests)

from napari_attnreg.io.slides import open_slide

slide = test_slides.slide


@pytest.fixture
def cut(slide, tmp_path):
    data = slide.read_bytes()
    path = tmp_path / "copied.svs"
    path.write_bytes(data[:len(data) * 3 // 4])  # a copy that stopped three quarters in
    return path


def test_a_cut_slide_says_so_and_a_lost_level_is_named_as_lost(cut, caplog):
    with pytest.warns(UserWarning, match=r"copied.svs is cut short .* Copy the file again"):
        image = open_slide(cut)
    assert image.level == 0
    with pytest.raises(ValueError, match=r"level 2 does not exist\. copied.svs is cut short"):
        open_slide(cut, level=2)
    assert "invalid page offset" not in caplog.text  # tifffile's raw line is not shown


def test_a_whole_slide_opens_without_a_warning(slide, recwarn):
    open_slide(slide, level=2)
    assert not [w for w in recwarn if "cut short" in str(w.message)]


def test_the_command_line_says_so_in_one_line_of_its_own(cut, tmp_path, capsys):
    from napari_attnreg.cli import main

    main(["run", str(cut), "--tiled", "--level", "0", "--out", str(tmp_path / "out"),
          "--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert "attnreg: warning: copied.svs is cut short" in err
    assert "UserWarning" not in err and "open_slide(" not in err  # not Python's two lines


def test_a_read_of_a_slide_cut_inside_its_full_resolution_leaves_no_reads_behind(slide,
                                                                                tmp_path):
    # its level 0 ends a third in: zarr reads a region's tiles as concurrent tasks, and when
    # one failed the others were left running; at exit each printed an asyncio traceback
    # ("Task exception was never retrieved", "Task was destroyed but it is pending", dozens)
    # after the command line's one clear error line
    import asyncio

    sync = pytest.importorskip("zarr.core.sync")
    data = slide.read_bytes()
    cut = tmp_path / "cut.svs"
    cut.write_bytes(data[:len(data) // 3])
    with pytest.warns(UserWarning, match="cut short"):
        image = open_slide(cut)
    with pytest.raises(ValueError, match="cut.svs is not a readable image"):
        image.read(slice(0, image.shape[0]), slice(0, image.shape[1]))

    async def left() -> int:
        return sum(task is not asyncio.current_task() for task in asyncio.all_tasks())

    assert asyncio.run_coroutine_threadsafe(left(), sync.loop[0]).result(30) == 0
