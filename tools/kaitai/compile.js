#!/usr/bin/env node
// Compile one Kaitai Struct schema (.ksy) into Python source files.
//
// Usage: node compile.js <schema.ksy> <output-dir>
//
// The npm package `kaitai-struct-compiler` (0.11) has no command-line interface: it exports
// compile(language, ksyObject, importer, debug) and returns a Promise of {fileName: source}.
// We parse the YAML ourselves with `js-yaml` (see /work/shared/notes/toolchain.md).
// `meta/imports` are resolved by a small importer: `foo` or `../foo` means `foo.ksy` next to
// the importing schema (both "rel" and "abs" imports are looked up from that folder). The
// generated Python of an importing schema does `import foo`, so every imported schema has to
// be compiled into the same output folder (build.sh compiles all of schemas/).
'use strict';

const fs = require('fs');
const path = require('path');
const yaml = require('js-yaml');
const ksc = require('kaitai-struct-compiler');

function importerFor(ksyPath) {
  const base = path.dirname(path.resolve(ksyPath));
  return {
    importYaml(name, _mode) {
      const file = path.join(base, `${name}.ksy`);
      try {
        return Promise.resolve(yaml.load(fs.readFileSync(file, 'utf8'), { filename: file }));
      } catch (err) {
        return Promise.reject(new Error(`${ksyPath}: cannot import '${name}' (${file}): ${err.message}`));
      }
    },
  };
}

function main(argv) {
  if (argv.length !== 2) {
    console.error('usage: node compile.js <schema.ksy> <output-dir>');
    return Promise.resolve(2);
  }
  const [ksyPath, outDir] = argv;
  const spec = yaml.load(fs.readFileSync(ksyPath, 'utf8'), { filename: ksyPath });
  if (spec === null || typeof spec !== 'object' || !spec.meta || !spec.meta.id) {
    console.error(`${ksyPath}: not a Kaitai Struct schema (no meta/id)`);
    return Promise.resolve(1);
  }
  fs.mkdirSync(outDir, { recursive: true });
  return ksc.compile('python', spec, importerFor(ksyPath), false).then((files) => {
    for (const [name, body] of Object.entries(files)) {
      const target = path.join(outDir, name);
      fs.writeFileSync(target, body);
      console.log(`${ksyPath} -> ${target}`);
    }
    return 0;
  });
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (err) => {
    // The compiler rejects with Scala.js exception objects; print whatever text they carry.
    const text = err && (err.stack || err.message || (err.toString && err.toString()));
    console.error(`kaitai-struct-compiler failed on ${process.argv[2]}:\n${text || JSON.stringify(err)}`);
    process.exitCode = 1;
  },
);
