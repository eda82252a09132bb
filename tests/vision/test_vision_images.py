"""Image inputs: decoded on the caller's thread; every bad one refused at submit with a one-line
error naming the field, while a concurrent request completes."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from mlx_nb import Engine
from mlx_nb.engine.inputs.images import ImageOptions, decode_message_images, images_in, load_image
from mlx_nb.engine.types import RequestError
from vision_reference import data_url, picture

PIC = picture(40, 30, 5)


def part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(image_part: dict) -> list:
    return [{"role": "user", "content": [{"type": "text", "text": "look"}, image_part]}]


@pytest.fixture
def opts(tmp_path):
    return ImageOptions(roots=[tmp_path])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_decode_to_rgb(fmt, opts):
    img = load_image(data_url(PIC, fmt), "x", opts)
    assert img.mode == "RGB" and img.size == (40, 30)
    if fmt == "PNG":
        assert np.array_equal(np.asarray(img), np.asarray(PIC))


def test_gif_first_frame_and_alpha(opts):
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    gif = load_image("data:image/gif;base64," + base64.b64encode(buf.getvalue()).decode(), "x", opts)
    assert gif.getpixel((0, 0))[0] > 200 and gif.getpixel((0, 0))[2] < 50
    clear = load_image(Image.new("RGBA", (4, 4), (0, 0, 0, 0)), "x", opts)  # transparent -> white
    assert clear.mode == "RGB" and clear.getpixel((0, 0)) == (255, 255, 255)


def test_pil_array_and_files_under_the_root(tmp_path, opts):
    arr = np.asarray(PIC)
    assert np.array_equal(np.asarray(load_image(arr, "x", opts)), arr)
    assert load_image(arr.astype(np.float32) / 255.0, "x", opts).size == (40, 30)
    assert load_image(arr[..., 0], "x", opts).mode == "RGB"
    path = tmp_path / "pic.png"
    PIC.save(path)
    for ref in (str(path), path.as_uri()):
        assert np.array_equal(np.asarray(load_image(ref, "x", opts)), arr)


def test_decode_keeps_order_and_names_fields(opts):
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [part(data_url(PIC)), {"type": "text", "text": "t"}, {"type": "image", "image": PIC}]},
    ]
    decoded = decode_message_images(msgs, opts)
    assert [p["type"] for p in decoded[1]["content"]] == ["image", "text", "image"]
    assert len(images_in(decoded)) == 2 and msgs[1]["content"][0]["type"] == "image_url"  # input untouched
    with pytest.raises(RequestError) as err:
        decode_message_images([msgs[0], {"role": "user", "content": [{"type": "text", "text": "t"}, part("data:,x")]}], opts)
    assert str(err.value).startswith("messages[1].content[1]: ") and err.value.field == "messages[1].content[1]"


def test_limits(opts):
    small = ImageOptions(roots=opts.roots, max_bytes=100, max_pixels=40 * 30)
    with pytest.raises(RequestError, match="larger than 100 bytes"):
        load_image(data_url(PIC), "x", small)
    with pytest.raises(RequestError, match="more than 1199 pixels"):
        load_image(PIC, "x", ImageOptions(roots=opts.roots, max_pixels=40 * 30 - 1))
    with pytest.raises(RequestError, match="HxW"):
        load_image(np.zeros((2, 3, 4, 5), np.uint8), "x", opts)


# -- at submit, through the engine ---------------------------------------------------------------
@pytest.fixture(scope="module")
def image_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("allowed")
    outside = tmp_path_factory.mktemp("outside")
    PIC.save(root / "ok.png")
    PIC.save(outside / "secret.png")
    (root / "notes.txt").write_text("this is not an image\n")
    with Engine("tiny-qwen3-vl", image_roots=[root], wait=True) as engine:
        yield engine, root, outside


BAD = {
    "corrupt base64": ("data:image/png;base64,iVBORw0K!!!not-base64", "not valid base64"),
    "not an image": ("data:image/png;base64," + base64.b64encode(b"hello, not a picture").decode(), "not a readable image"),
    "remote url": ("https://example.com/cat.png", "remote image URLs are not fetched"),
}


def test_bad_images_fail_alone_at_submit(image_engine):
    engine, root, outside = image_engine
    good = engine.submit(messages=chat(part(str(root / "ok.png"))), max_tokens=8)
    cases = {**BAD,
             "non-image file": (str(root / "notes.txt"), "not a readable image"),
             "outside the root": (str(outside / "secret.png"), "outside the allowed image roots"),
             "outside via file url": ((outside / "secret.png").as_uri(), "outside the allowed image roots"),
             "missing file": (str(root / "nope.png"), "not found")}
    for label, (url, reason) in cases.items():
        with pytest.raises(RequestError) as err:
            engine.submit(messages=chat(part(url)), max_tokens=8)
        message = str(err.value)
        assert "\n" not in message, label
        assert message.startswith("messages[0].content[1]: ") and reason in message, (label, message)
    r = good.result(timeout=120)
    assert r.error is None and r.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > len(engine.loaded.tokenizer.encode("look"))


def test_a_text_model_still_refuses_images():
    with Engine("tiny-llama", wait=True) as engine:
        with pytest.raises(RequestError, match="text-only"):
            engine.submit(messages=chat(part(data_url(PIC))))
