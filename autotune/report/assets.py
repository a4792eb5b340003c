"""The page's style sheet and script, inline in every report (it loads nothing)."""

CSS = """
:root{--ink:#222;--muted:#666;--line:#ddd;--accent:#4878cf}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);
 max-width:1120px;margin:0 auto;padding:0 16px 40px}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid var(--line);padding:6px 0;z-index:2}
nav a{margin-right:16px}
h1{font-size:22px;margin:14px 0 4px}
h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:22px 0 4px}
a{color:#2a5db0}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:6px 12px;min-width:100px;max-width:220px}
.card b{display:block;font-size:20px}
.card span{color:var(--muted);font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:4px 6px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
thead th{position:sticky;top:31px;background:#f4f4f4;white-space:nowrap}
table.sortable thead th{cursor:pointer}
th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tbody tr:nth-child(even){background:#fafafa}
tbody tr:hover{background:#eef3fb}
code,.sig{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.sig{overflow-wrap:break-word}
.wide{overflow-x:auto}  /* a table wider than the page scrolls in its box, never squeezed */
td.sig{min-width:22ch;max-width:44ch}
td code{overflow-wrap:break-word}
.coverage{font-size:15px;margin:6px 0}
code.next{background:#f4f4f4;padding:1px 5px;border-radius:3px;font-size:13px}
.small{color:var(--muted);font-size:12px}
.badge{display:inline-block;border-radius:8px;padding:0 7px;font-size:11px;background:#eee}
.badge.stale{background:#ffd79a}.badge.current,.badge.db{background:#d4f0d4}
.badge.shipped{background:#cfe8f3}.badge.nearest,.badge.overlay{background:#fff0c2}
.badge.refused{background:#f6c6c6}
.spd{display:inline-block;min-width:56px;padding:0 3px;
 background:linear-gradient(90deg,#cfe8c8 var(--w),transparent var(--w))}
.tbar{position:relative;width:150px;height:10px;margin-top:4px}
.tbar i,.tbar b{position:absolute;left:0;top:0;height:10px}
.tbar i{background:#ccc}.tbar b{background:var(--accent)}
.charts{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:0}
figcaption{font-size:12px;color:var(--muted);max-width:520px;margin-bottom:2px}
svg{max-width:100%;height:auto}
.controls{display:flex;flex-wrap:wrap;gap:12px;align-items:center;margin:8px 0}
input[type=search]{width:320px;padding:4px 8px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0 10px;font-size:13px}
dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0}
"""

# Sorting: a click (or Enter) on a column's head sorts by the cells' data-v where they have one
# (numbers; empty sorts last), else by their text. Filtering: every word typed must appear in
# a row (and its device kind match the one chosen); `#q=words` in the address fills it in.
SCRIPT = """
for (const table of document.querySelectorAll("table.sortable")) {
  const body = table.tBodies[0], heads = [...table.tHead.rows[0].cells];
  heads.forEach((th, i) => {
    th.tabIndex = 0;
    th.setAttribute("aria-sort", "none");
    const sort = () => {
      const up = th.getAttribute("aria-sort") !== "ascending";
      heads.forEach(h => h.setAttribute("aria-sort", "none"));
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      const key = r => {
        const c = r.cells[i], v = c.dataset.v ?? c.textContent.trim().toLowerCase();
        return v === "" ? null : isNaN(v) ? v : +v;
      };
      const rows = [...body.rows].sort((a, b) => {
        const x = key(a), y = key(b);
        if (x === null || y === null) return (x === null) - (y === null);
        return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1);
      });
      body.append(...rows);
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", e => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); }
    });
  });
}
const filter = document.getElementById("filter");
if (filter) {
  const rows = [...document.querySelectorAll("#overview-table tbody tr")];
  const device = document.getElementById("device"), shown = document.getElementById("shown");
  const apply = () => {
    const words = filter.value.toLowerCase().split(/\\s+/).filter(Boolean);
    const kind = device ? device.value : "";
    let n = 0;
    for (const r of rows) {
      const text = r.textContent.toLowerCase();
      r.hidden = !words.every(w => text.includes(w)) || (kind !== "" && r.dataset.device !== kind);
      n += !r.hidden;
    }
    shown.textContent = n + " of " + rows.length + " entries";
  };
  filter.value = new URLSearchParams(location.hash.slice(1)).get("q") || "";
  filter.addEventListener("input", apply);
  if (device) device.addEventListener("change", apply);
  apply();
}
"""
