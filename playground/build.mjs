// Bundles the playground's one browser dependency, the graphql-ws client, into
// vendor/graphql-ws.js (committed, so serving the page needs no Node).
// Run after changing the version in package.json: npm ci && npm run build
import { readFileSync } from "node:fs";
import { build } from "esbuild";

const { version, license } = JSON.parse(
  readFileSync(new URL("node_modules/graphql-ws/package.json", import.meta.url)),
);

await build({
  stdin: { contents: 'export { createClient } from "graphql-ws";', resolveDir: "." },
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  banner: { js: `/*! graphql-ws ${version} | ${license} License | github.com/enisdenjo/graphql-ws */` },
  outfile: "vendor/graphql-ws.js",
  logLevel: "info",
});
