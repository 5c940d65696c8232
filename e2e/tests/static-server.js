// A bare static file server for the example apps: what a user's own host does, with none of
// `runner serve`'s layout (no /pkg/, no models) and no cross-origin isolation headers.
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.ts': 'text/plain',
  '.md': 'text/plain',
};

/** The file under `root` a request names, or null if it leaves `root` or is not a file. */
function fileFor(root, url) {
  const urlPath = decodeURIComponent(new URL(url, 'http://localhost').pathname);
  const file = path.join(root, urlPath.endsWith('/') ? `${urlPath}index.html` : urlPath);
  if (file !== root && !file.startsWith(root + path.sep)) return null;
  return fs.statSync(file, { throwIfNoEntry: false })?.isFile() ? file : null;
}

/** Serves `root` on a free port of 127.0.0.1; `served` lists the paths it answered with 200. */
async function startStaticServer(root) {
  const served = [];
  const server = http.createServer((req, res) => {
    const file = fileFor(root, req.url);
    if (!file || req.method !== 'GET') {
      res.writeHead(404).end();
      return;
    }
    served.push(new URL(req.url, 'http://localhost').pathname);
    res.writeHead(200, { 'content-type': TYPES[path.extname(file)] || 'application/octet-stream' });
    fs.createReadStream(file).pipe(res);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    served,
    close: () => new Promise((resolve) => server.close(resolve)),
  };
}

module.exports = { startStaticServer };
