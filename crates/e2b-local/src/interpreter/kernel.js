// The JavaScript of a code-interpreter context, hosted by kernel.py: cells arrive on stdin,
// one JSON line each ({"code", "env"}); the answer to each is one JSON line on the pipe
// whose fd E2B_ANSWER_FD names
// ({"text"} for a value, {"error": {name, value, traceback}}, or {}). stdout and stderr are
// kernel.py's pipes, so console output streams as the cell runs (Node writes pipes
// synchronously on Linux, so it is in the pipe before the answer is).
'use strict';
const fs = require('fs');
const readline = require('readline');
const util = require('util');
const vm = require('vm');

globalThis.require = require;
globalThis.module = module;

// `import` lines become `require`s (`var`, so a cell can run twice).
function imports(code) {
  return code
    .replace(/^(\s*)import\s+\*\s+as\s+(\w+)\s+from\s+(['"][^'"]+['"]);?/gm, '$1var $2 = require($3);')
    .replace(/^(\s*)import\s+\{([^}]*)\}\s+from\s+(['"][^'"]+['"]);?/gm, (_, indent, names, from) =>
      `${indent}var {${names.replace(/(\w+)\s+as\s+(\w+)/g, '$1: $2')}} = require(${from});`)
    .replace(/^(\s*)import\s+(\w+)\s*,?\s*(?:\{([^}]*)\})?\s+from\s+(['"][^'"]+['"]);?/gm,
      (_, indent, name, names, from) => {
        const rest = names ? ` var {${names.replace(/(\w+)\s+as\s+(\w+)/g, '$1: $2')}} = require(${from});` : '';
        return `${indent}var ${name} = ((m) => m && m.__esModule ? m.default : m)(require(${from}));${rest}`;
      })
    .replace(/^(\s*)import\s+(['"][^'"]+['"]);?/gm, '$1require($2);');
}

// A cell with top-level `await` runs in an async function whose last line, when it is an
// expression, is returned; its declarations stay in the cell.
function wrapAwait(code) {
  const lines = code.replace(/\s+$/, '').split('\n');
  let last = lines.length - 1;
  while (last >= 0 && !lines[last].trim()) last--;
  const tail = last >= 0 ? lines[last].trim().replace(/;$/, '') : '';
  const statement = /^(const|let|var|function|class|if|for|while|do|switch|try|return|throw|import|export|\}|\/\/)/.test(tail);
  if (tail && !statement) {
    lines[last] = `return (${tail});`;
  }
  return `(async () => {\n${lines.join('\n')}\n})()`;
}

async function run(code) {
  code = imports(code);
  if (/\bawait\b/.test(code)) {
    return await vm.runInThisContext(wrapAwait(code), { filename: 'cell' });
  }
  const value = vm.runInThisContext(code, { filename: 'cell' });
  return value instanceof Promise ? await value : value;
}

const ANSWER_FD = Number(process.env.E2B_ANSWER_FD);
delete process.env.E2B_ANSWER_FD;

function answer(obj) {
  fs.writeSync(ANSWER_FD, JSON.stringify(obj) + '\n');
}

const input = readline.createInterface({ input: process.stdin, terminal: false });
const queue = [];
let busy = false;

async function next() {
  if (busy || !queue.length) return;
  busy = true;
  const request = queue.shift();
  const env = request.env || {};
  const saved = {};
  for (const [k, v] of Object.entries(env)) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  try {
    const value = await run(request.code || '');
    answer(value === undefined ? {} : { text: util.inspect(value) });
  } catch (error) {
    const isError = error instanceof Error;
    answer({
      error: {
        name: isError ? error.name : 'Error',
        value: isError ? error.message : util.inspect(error),
        // The cell's own frames: the lines below it are this script's.
        traceback: isError
          ? String(error.stack || '').split('\n').filter((line) => !/node:|\[eval\]/.test(line)).join('\n')
          : '',
      },
    });
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    busy = false;
    next();
  }
}

input.on('line', (line) => {
  try {
    queue.push(JSON.parse(line));
  } catch (_) {
    return;
  }
  next();
});
