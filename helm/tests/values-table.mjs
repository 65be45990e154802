// The values table of helm/sagapool/README.md, generated from the "# --"
// comments of values.yaml (the helm-docs convention): a key with such a
// comment is one row; a map without one is walked into.
//   node helm/tests/values-table.mjs          print the table
//   node helm/tests/values-table.mjs --write  update README.md between its markers
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const chart = path.resolve(here, "../sagapool");
const nodeModules = process.env.SAGA_NODE_MODULES || path.resolve(here, "../../.tools/node/node_modules");
const YAML = createRequire(path.join(nodeModules, "noop.js"))("yaml");

function description(comment) {
  if (!comment) return "";
  const lines = comment.split("\n").map((l) => l.replace(/^ ?/, ""));
  const start = lines.findIndex((l) => l.startsWith("-- "));
  if (start < 0) return "";
  return lines.slice(start).join(" ").replace(/^-- /, "").replace(/\s+/g, " ").trim();
}

function rowsOf(map, prefix, rows) {
  map.items.forEach((pair, i) => {
    const key = prefix + String(pair.key.value);
    // A comment above the first key of a nested map belongs to the map.
    const comment = pair.key.commentBefore ?? (i === 0 && prefix ? map.commentBefore : undefined);
    const desc = description(comment);
    const value = pair.value;
    if (!desc && YAML.isMap(value) && value.items.length > 0) {
      rowsOf(value, `${key}.`, rows);
    } else {
      rows.push({ key, value: value?.toJSON ? value.toJSON() : null, description: desc });
    }
  });
  return rows;
}

const cell = (s) => String(s).replace(/\|/g, "\\|");

export function valuesTable({ rows = false } = {}) {
  const doc = YAML.parseDocument(fs.readFileSync(path.join(chart, "values.yaml"), "utf8"));
  const all = rowsOf(doc.contents, "", []);
  if (rows) return all;
  const lines = ["| Key | Default | Description |", "| --- | --- | --- |"];
  for (const r of all) {
    lines.push(`| \`${cell(r.key)}\` | \`${cell(JSON.stringify(r.value))}\` | ${cell(r.description)} |`);
  }
  return lines.join("\n") + "\n";
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const table = valuesTable();
  if (process.argv[2] === "--write") {
    const readme = path.join(chart, "README.md");
    const text = fs.readFileSync(readme, "utf8");
    const re = /(<!-- values-table:start -->\n)[\s\S]*?(<!-- values-table:end -->)/;
    if (!re.test(text)) throw new Error("README.md has no values-table markers");
    fs.writeFileSync(readme, text.replace(re, (_, a, b) => a + table + b));
  } else {
    process.stdout.write(table);
  }
}
