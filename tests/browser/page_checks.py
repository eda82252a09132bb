"""What the browser test measures on a rendered page: colours and contrast, layout overflow."""

from __future__ import annotations

import re
import time

# For each element: the colour its text is painted in (an SVG text's `fill`, else `color`), the
# colour behind it (its own background, else the nearest ancestor's that is not transparent), and
# its text. One call for all: live widgets redraw, so elements must not be looked up one by one;
# an element a redraw removed between the lookup and this call (it has no computed style) is skipped.
COLOURS_JS = """(els) => els.filter(el => el.isConnected).map(el => {
  const style = getComputedStyle(el);
  const fg = el instanceof SVGElement ? style.fill : style.color;
  let alpha = parseFloat(style.opacity);  // faded labels count as faded
  for (let up = el.parentElement; up && up instanceof SVGElement; up = up.parentElement)
    alpha *= parseFloat(getComputedStyle(up).opacity);
  let node = el, bg = 'rgb(255, 255, 255)';
  while (node && node.nodeType === 1) {
    const c = getComputedStyle(node).backgroundColor;
    if (c && c !== 'transparent' && !/rgba\\(.*,\\s*0\\)$/.test(c)) { bg = c; break; }
    node = node.parentElement;
  }
  return [fg, bg, alpha, (el.textContent || '').slice(0, 40)];
})"""

# Elements of `root` whose content is wider than their box (clipped or scrolled controls).
OVERFLOW_JS = """(root) => [root, ...root.querySelectorAll('.widget-hbox, .widget-vbox')]
  .filter(el => el.scrollWidth > el.clientWidth + 1)
  .map(el => `${el.className}: ${el.scrollWidth} > ${el.clientWidth}`)"""


def rgba(css: str) -> tuple[float, float, float, float]:
    """`rgb(1, 2, 3)`, `rgba(1, 2, 3, 0.5)` or `color(srgb 0.1 0.2 0.3 / 0.5)` (what color-mix()
    computes to) -> red, green, blue, alpha in 0..1."""
    numbers = [float(n) for n in re.findall(r"[\d.]+", css)]
    if css.startswith("color(srgb"):
        return (*numbers[:3], numbers[3] if len(numbers) > 3 else 1.0)
    if css.startswith("rgb"):
        return (*(n / 255 for n in numbers[:3]), numbers[3] if len(numbers) > 3 else 1.0)
    raise ValueError(f"not a colour this test reads: {css!r}")


def luminance(c) -> float:
    """WCAG relative luminance."""
    lin = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in c[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(fg: str, bg: str, opacity: float = 1.0) -> float:
    """WCAG contrast ratio of `fg` (with its alpha and `opacity`) painted on `bg`: 1 to 21."""
    *f, a = rgba(fg)
    b = rgba(bg)[:3]
    a *= opacity
    painted = [a * x + (1 - a) * y for x, y in zip(f, b)]
    hi, lo = sorted((luminance(painted), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def weakest_contrast(locator) -> tuple[float, str]:
    """The lowest text/background contrast among the elements of `locator`."""
    worst, where = 99.0, ""
    for _ in range(20):  # a redraw may replace every element at once: measure the new ones
        measured = locator.evaluate_all(COLOURS_JS)
        if measured:
            break
        time.sleep(0.1)
    assert measured, "no element stayed on the page long enough to be measured"
    for fg, bg, alpha, text in measured:
        ratio = contrast(fg, bg, alpha)
        if ratio < worst:
            worst, where = ratio, f"{text!r}: {fg} x {alpha:.2f} on {bg}"
    return worst, where
