// Builds the API's static assets into gwtf/api/static: the dashboard's page, script and style,
// uPlot for its charts, and Swagger UI for /docs, all from node_modules (pinned by
// package-lock.json), so neither page fetches anything from a CDN. Run by `npm ci`
// (postinstall).
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..", ".."); // the repository (node_modules)
const out = join(here, "..", "static");

function copy(from, names, to = out) {
  mkdirSync(to, { recursive: true });
  for (const name of names) copyFileSync(join(from, name), join(to, name));
}

copy(here, ["index.html", "app.js", "style.css"]);
copy(join(root, "node_modules", "uplot", "dist"), ["uPlot.iife.min.js", "uPlot.min.css"]);
// The bundle carries its dependencies; its licence notices travel with it.
copy(
  join(root, "node_modules", "swagger-ui-dist"),
  ["swagger-ui-bundle.js", "swagger-ui-bundle.js.LICENSE.txt", "swagger-ui.css",
    "favicon-32x32.png", "LICENSE", "NOTICE"],
  join(out, "swagger-ui"),
);
console.log(`dashboard and docs assets built into ${out}`);
