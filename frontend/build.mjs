// Bundles src/index.ts (and uPlot, and the CSS as text) into one ES module that
// TensorBoard's iframe imports. Deterministic: no timestamps, no absolute paths, no
// sourcemap, fixed target, so `make bundle-check` can compare bytes.
// Usage: node build.mjs [outfile]   (default ../tb_parity_plugin/static/index.js)
import * as esbuild from "esbuild";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const outfile = path.resolve(process.argv[2] ?? path.join(here, "..", "tb_parity_plugin", "static", "index.js"));

await esbuild.build({
  absWorkingDir: here,
  entryPoints: ["src/index.ts"],
  outfile,
  bundle: true,
  format: "esm",
  target: "es2020",
  minify: true,
  legalComments: "eof",
  charset: "utf8",
  sourcemap: false,
  loader: { ".css": "text" },
  logLevel: "warning",
});
