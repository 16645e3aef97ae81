// Builds the dashboard's static assets into api/static: the page, its script and style, and
// uPlot from node_modules (pinned by package-lock.json). Run by `npm ci` (postinstall).
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const out = join(here, "..", "static");
mkdirSync(out, { recursive: true });
for (const name of ["index.html", "app.js", "style.css"]) {
  copyFileSync(join(here, name), join(out, name));
}
const uplot = join(root, "node_modules", "uplot", "dist");
copyFileSync(join(uplot, "uPlot.iife.min.js"), join(out, "uPlot.iife.min.js"));
copyFileSync(join(uplot, "uPlot.min.css"), join(out, "uPlot.min.css"));
console.log(`dashboard built into ${out}`);
