"""What the run report's page carries besides its content (:mod:`plasticlm.run_report`): its
style sheet and the script that, once a browser has loaded the page, writes what rendered
(tables, plots, errors, anything sticking out of the page) into ``#render-check``, where the
browser tests read it."""

# Written by the page itself once the browser has loaded it: what rendered.
# Errors are counted from the first script on; overflow = anything wider than the window.
ERRORS = "<script>window.__errors = 0; window.addEventListener('error', () => window.__errors++);" \
    "</script>"
CHECK = """<script>
window.addEventListener('load', () => {
  const images = [...document.images];
  const ok = images.filter(i => i.complete && i.naturalWidth > 0).length;
  const el = document.getElementById('render-check');
  // what sticks out of the page (inside a scrolling table box or code block is fine)
  const width = document.documentElement.clientWidth + 1;
  // an element past the window's edge, or whose own text runs out of its box (a long path
  // in a heading widens the page without any element doing so)
  const sticking = [...document.body.querySelectorAll('*')].filter(
    e => !e.closest('.wide, pre') && (e.getBoundingClientRect().right > width
      || (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'visible')));
  const wide = sticking.length + (document.documentElement.scrollWidth > width ? 1 : 0);
  // which elements, for the one who reads a failed check
  el.dataset.overflowWhat = sticking.slice(0, 5).map(
    e => e.tagName.toLowerCase() + ':' + e.textContent.slice(0, 60)).join(' | ');
  el.dataset.tables = document.querySelectorAll('table').length;
  el.dataset.images = images.length;
  el.dataset.imagesRendered = ok;
  el.dataset.overflowing = wide;
  el.dataset.errors = window.__errors;
  el.textContent = `rendered: ${el.dataset.tables} tables, ${ok} of ${images.length} plots`;
});
</script>"""
STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; box-sizing: border-box; border: 1px solid #eee; margin: 0.5em 0; }
.wide { overflow-x: auto; max-width: 100%; } code, h1, h2, h3, p, li { overflow-wrap: anywhere; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
section { border-top: 2px solid #ddd; margin-top: 2em; } .smoke { background: #fff3cd; padding: 0.5em; } .meta td:first-child { font-weight: 600; }
</style>"""
