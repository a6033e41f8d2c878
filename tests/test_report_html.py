"""`snakemake --report report.html`: every notebook's figure and table under its paper and
experiment with its caption, the claims table and the run record, in one self-contained file;
where Chromium is installed, the report opened in it shows every image and the claims table.

The report is built on a copy of the code from the files the rules mark with report(), written
here (figures drawn by matplotlib, tables rendered by experiments/report/html_page.py, a run
record from fabricated benchmark files): what the notebooks draw is tested in
test_notebooks.py; here, that the report holds all of it, intact."""
import base64
import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import pytest

from experiments.records import paths, run_record
from experiments.report import html_page
from snakemake_run import copy_checkout, snakemake_in

ROOT = Path(__file__).resolve().parents[1]
RUN = "smoke-cpu"  # the default profile's run
NOTEBOOKS = sorted(p.stem for p in (ROOT / "figures").glob("*.ipynb"))
#: Each paper's category, by the prefix of its notebooks' names (anything else is a summary).
PAPERS = {"densenet_": "Memory-efficient DenseNets", "iabn_": "In-Place Activated BatchNorm"}
CLAIM = "| DenseNet Fig. 4 | memory grows linearly | reproduced |"
CLAIMS_MD = "# Claims\n\n| experiment | claim | verdict |\n|---|---|---|\n" + CLAIM + "\n"


def draw(path, pixels):
    """A PNG of ``pixels`` = (width, height), as a notebook saves one."""
    fig = plt.figure(figsize=(pixels[0] / 100, pixels[1] / 100), dpi=100)
    fig.add_subplot().plot([0, 1], [1, 0])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure_size(index):
    """A size of its own for each notebook's figure, so a report showing one figure for another
    is caught."""
    return (200 + 10 * index, 150 + 5 * index)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the code holding every file the workflow marks for the report."""
    root = copy_checkout(tmp_path_factory.mktemp("checkout"))
    for index, notebook in enumerate(NOTEBOOKS):
        draw(root / paths.rendered(notebook, RUN, "png"), figure_size(index))
        table = root / paths.rendered(notebook, RUN, "md")
        table.write_text(f"| notebook | value |\n|---|---|\n| {notebook} | {index} |\n")
        html_page.write_html(table, table.with_suffix(".html"))
    claims = root / "figures" / "claims.md"
    claims.write_text(CLAIMS_MD)
    html_page.write_html(claims, claims.with_suffix(".html"))
    benchmark = Path(paths.job_benchmark("render", RUN, NOTEBOOKS[0], root=root / "artifacts"))
    benchmark.parent.mkdir(parents=True)
    benchmark.write_text("s\tcpu_time\tmax_rss\n12.5\t11.0\t300.0\n")
    assert run_record.main(["--run", RUN, "--profile", "smoke", "--device", "cpu",
                            "--benchmarks", str(root / "artifacts" / "benchmarks"),
                            "--out", str(root / paths.run_record(RUN, "json"))]) == 0
    return root


@pytest.fixture(scope="module")
def report(checkout):
    """``snakemake --report report.html`` in ``checkout``: the report's path."""
    result = snakemake_in(checkout, "--report", "report.html")
    assert result.returncode == 0, result.stderr
    return checkout / "report.html"


def report_variable(report, name):
    """The JSON the report's ``<script ...>var NAME = ...;</script>`` holds."""
    match = re.search(rf'<script id="[\w-]+">\s*var {name} = (.*?);\s*</script>',
                      report.read_text(encoding="utf-8"), re.S)
    assert match, f"no variable {name} in the report"
    return json.loads(match.group(1))


def data(uri):
    """The bytes of a base64 data URI."""
    header, _, payload = uri.partition(",")
    assert header.endswith(";base64"), header
    return base64.b64decode(payload)


def paper(notebook):
    return next((name for prefix, name in PAPERS.items() if notebook.startswith(prefix)),
                "Summary")


def test_every_figure_and_table_is_in_the_report_under_its_paper(report, checkout):
    results, categories = report_variable(report, "results"), report_variable(report, "categories")
    for index, notebook in enumerate(NOTEBOOKS):
        category = [name for name in categories if name.startswith(paper(notebook))]
        assert len(category) == 1, (notebook, list(categories))
        figure, table = (paths.rendered(notebook, RUN, s) for s in ("png", "html"))
        assert sorted(categories[category[0]][notebook]) == sorted([figure, table])

        shown = results[figure]
        assert shown["mime_type"] == "image/png"
        png = data(shown["data_uri"])
        assert png == (checkout / figure).read_bytes()
        height, width = matplotlib.image.imread(io.BytesIO(png)).shape[:2]
        assert (width, height) == figure_size(index)
        assert results[table]["mime_type"] == "text/html"
        assert f"<td>{notebook}</td>" in data(results[table]["data_uri"]).decode()
        for path in (figure, table):
            caption = results[path]["caption"]
            assert "smoke-cpu" in caption and f"figures/{notebook}.ipynb" in caption, caption
            assert "No caption" not in caption, caption


def test_the_report_says_what_it_holds_and_the_profile_it_ran_at(report):
    description = report_variable(report, "workflow_desc")
    assert "In-Place Activated BatchNorm, reproduced" in description
    assert re.search(r"profile\s+<tt[^>]*>smoke</tt>", description), description


def test_the_claims_table_and_the_run_record_are_in_the_report(report):
    results, categories = report_variable(report, "results"), report_variable(report, "categories")
    summary = next(name for name in categories if name.startswith("Summary"))
    assert categories[summary]["claims"] == ["figures/claims.html"]
    assert categories[summary]["run record"] == [paths.run_record(RUN, "html")]
    claims = data(results["figures/claims.html"]["data_uri"]).decode()
    assert "<td>memory grows linearly</td>" in claims and "<td>reproduced</td>" in claims
    record = data(results[paths.run_record(RUN, "html")]["data_uri"]).decode()
    assert "<td>render</td>" in record and "<td>12.5</td>" in record
    for path in ("figures/claims.html", paths.run_record(RUN, "html")):
        assert "smoke" in results[path]["caption"], results[path]["caption"]


#: Run in the report once it has loaded: show every image result through the report's own
#: view (``app.setView``, what clicking a result does) and measure the image it displays; open
#: the claims page in a frame and measure its table. The findings go to ``<pre id="check">``.
CHECK_SCRIPT = """
<script>
window.addEventListener("load", async () => {
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  const found = {images: {}, claims: null};
  // React renders the report's App (which sets the global `app`) after the page has loaded.
  for (let i = 0; i < 500 && typeof app === "undefined"; i++) await sleep(10);
  for (const [path, result] of Object.entries(results)) {
    if (!result.mime_type.startsWith("image/")) continue;
    app.setView({content: "img", contentPath: result.data_uri, resultPath: path});
    let img;
    for (let i = 0; i < 200 && !img; i++) {
      await sleep(10);
      img = [...document.querySelectorAll("#app img")].find((e) => e.src === result.data_uri);
    }
    if (!img) { found.images[path] = "not shown"; continue; }
    // Polled, not img.decode(): headless Chromium's virtual time does not wait for a decode.
    for (let i = 0; i < 500 && !(img.complete && img.naturalWidth); i++) await sleep(10);
    const box = img.getBoundingClientRect();
    found.images[path] = [img.naturalWidth, img.naturalHeight, box.width > 0 && box.height > 0];
  }
  const claims = results["figures/claims.html"];
  app.setView({content: "html", contentPath: claims.data_uri, resultPath: "figures/claims.html"});
  await sleep(100);
  const frame = document.createElement("iframe");
  frame.style.width = "800px"; frame.style.height = "600px";
  frame.srcdoc = new TextDecoder().decode(
    Uint8Array.from(atob(claims.data_uri.split(",")[1]), (c) => c.charCodeAt(0)));
  const loaded = new Promise((done) => frame.addEventListener("load", done));
  document.body.appendChild(frame);
  await loaded;
  const table = frame.contentDocument.querySelector("table");
  const shownFrame = [...document.querySelectorAll("#app iframe")].some(
    (e) => e.src === claims.data_uri && e.getBoundingClientRect().height > 0);
  found.claims = table && {
    rows: table.querySelectorAll("tr").length, shownFrame,
    visible: table.getBoundingClientRect().height > 0
      && frame.contentWindow.getComputedStyle(table).visibility === "visible"};
  const out = document.createElement("pre");
  out.id = "check";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
"""


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="no headless browser: Chromium is not installed "
                    "(Debian: apt-get install chromium)")
def test_the_report_shows_every_image_and_the_claims_table_in_a_browser(report, tmp_path):
    text = report.read_text(encoding="utf-8")
    end = text.rindex("</body>")  # the page's own: the scripts it embeds may spell one too
    page = tmp_path / "report.html"
    page.write_text(text[:end] + CHECK_SCRIPT + text[end:], encoding="utf-8")
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=60000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="check">(.*?)</pre>', result.stdout, re.S)
    assert match, f"the check did not finish: {result.stderr[-2000:]}"
    found = json.loads(html.unescape(match.group(1)))

    images = {path: shown for path, shown in found["images"].items()}
    assert sorted(images) == sorted(paths.rendered(nb, RUN, "png") for nb in NOTEBOOKS)
    for index, notebook in enumerate(NOTEBOOKS):
        assert images[paths.rendered(notebook, RUN, "png")] == [*figure_size(index), True]
    assert found["claims"] == {"rows": 2, "shownFrame": True, "visible": True}
