// Bundles GraphiQL (React, the editor, the graphql-ws client) and main.js into
// vendor/graphiql.js and vendor/graphiql.css, committed so serving the page
// needs no Node and no network.
// Run after changing a version in package.json or main.js: npm ci && npm run build
import { readFileSync } from "node:fs";
import { build } from "esbuild";

const versions = ["graphiql", "react", "graphql", "graphql-ws"]
  .map((name) => {
    const { version } = JSON.parse(
      readFileSync(new URL(`node_modules/${name}/package.json`, import.meta.url)),
    );
    return `${name} ${version}`;
  })
  .join(", ");
// Each bundled package keeps its own license; esbuild moves their notices to
// the end of graphiql.js.
const banner = `/*! Keyturn's GraphiQL page, bundled from ${versions} and their dependencies */`;

await build({
  entryPoints: ["main.js"],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  // React's production build: no development checks or warnings.
  define: { "process.env.NODE_ENV": '"production"' },
  // The CSS inlines its fonts and icons as data: URLs; nothing else to copy.
  loader: { ".woff": "dataurl", ".woff2": "dataurl", ".png": "dataurl", ".svg": "dataurl" },
  banner: { js: banner, css: banner },
  outfile: "vendor/graphiql.js",
  logLevel: "info",
});
