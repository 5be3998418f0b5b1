// Drives a Gaia hub with the published @stacks/storage client, unchanged: connectToGaiaHub,
// uploadToGaiaHub, putFile (plain, encrypted, signed, both), getFile, listFiles,
// deleteFile. Usage: node client.mjs <hub url>. Prints one line per check and
// "N passed, N failed"; exits non-zero on any failure.
import { AppConfig, UserSession } from '@stacks/auth';
import { Storage, connectToGaiaHub, uploadToGaiaHub } from '@stacks/storage';

const hubUrl = process.argv[2];
if (!hubUrl) {
  console.error('usage: node client.mjs <hub url>');
  process.exit(2);
}
const appPrivateKey = '7d7e7f0a1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbcc0';

const session = new UserSession({ appConfig: new AppConfig(['store_write'], 'http://localhost:3999') });
const data = session.store.getSessionData();
data.userData = { appPrivateKey, hubUrl };
session.store.setSessionData(data);
const storage = new Storage({ userSession: session });

let passed = 0;
let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed += 1;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}
function eq(got, want, what) {
  if (got !== want) throw new Error(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

let hubConfig;
await check('connectToGaiaHub', async () => {
  hubConfig = await connectToGaiaHub(hubUrl, appPrivateKey);
  eq(hubConfig.url_prefix, `${hubUrl}/read/`, 'url_prefix');
  eq(hubConfig.server, hubUrl, 'server');
  if (!/^1[1-9A-HJ-NP-Za-km-z]{25,34}$/.test(hubConfig.address)) throw new Error(`address ${hubConfig.address}`);
});

await check('uploadToGaiaHub and read back', async () => {
  const res = await uploadToGaiaHub('raw/hello.txt', 'hello from stacks.js', hubConfig, 'text/plain');
  eq(res.publicURL, `${hubUrl}/read/${hubConfig.address}/raw/hello.txt`, 'publicURL');
  const r = await fetch(res.publicURL);
  eq(r.status, 200, 'status');
  eq(r.headers.get('etag'), res.etag, 'etag');
  eq(r.headers.get('content-type'), 'text/plain', 'content-type');
  eq(await r.text(), 'hello from stacks.js', 'body');
});

await check('putFile/getFile plain', async () => {
  await storage.putFile('plain.txt', 'plain text', { encrypt: false });
  eq(await storage.getFile('plain.txt', { decrypt: false }), 'plain text', 'content');
});

await check('putFile overwrite uses the ETag (If-Match)', async () => {
  await storage.putFile('plain.txt', 'second version', { encrypt: false });
  await storage.putFile('plain.txt', 'third version', { encrypt: false });
  eq(await storage.getFile('plain.txt', { decrypt: false }), 'third version', 'content');
  // A second session (no ETag known) creating the same file is refused, as by Gaia.
  const s2 = new UserSession({ appConfig: new AppConfig(['store_write'], 'http://localhost:3999') });
  const d2 = s2.store.getSessionData();
  d2.userData = { appPrivateKey, hubUrl };
  s2.store.setSessionData(d2);
  let refused = false;
  try {
    await new Storage({ userSession: s2 }).putFile('plain.txt', 'clobber', { encrypt: false });
  } catch (e) {
    refused = true;
  }
  eq(refused, true, 'second session create refused (If-None-Match)');
  await new Storage({ userSession: s2 }).putFile('plain.txt', 'forced', { encrypt: false, dangerouslyIgnoreEtag: true });
  eq(await storage.getFile('plain.txt', { decrypt: false }), 'forced', 'forced content');
});

const secret = JSON.stringify({ todos: ['buy milk', 'write tests'], n: 42 });
await check('putFile/getFile encrypted', async () => {
  await storage.putFile('secret.json', secret, { encrypt: true });
  eq(await storage.getFile('secret.json', { decrypt: true }), secret, 'decrypted');
  const raw = await (await fetch(`${hubConfig.url_prefix}${hubConfig.address}/secret.json`)).text();
  if (raw.includes('buy milk')) throw new Error('stored in the clear');
  if (!JSON.parse(raw).cipherText) throw new Error('not an encrypted envelope');
});

await check('putFile/getFile signed', async () => {
  await storage.putFile('signed.txt', 'signed text', { encrypt: false, sign: true });
  eq(await storage.getFile('signed.txt', { decrypt: false, verify: true }), 'signed text', 'verified');
});

await check('putFile/getFile encrypted and signed', async () => {
  await storage.putFile('both.json', secret, { encrypt: true, sign: true });
  eq(await storage.getFile('both.json', { decrypt: true, verify: true }), secret, 'verified + decrypted');
});

await check('putFile/getFile binary, 3 MB', async () => {
  const bytes = new Uint8Array(3 * 1024 * 1024);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + (i >> 10)) & 0xff;
  await storage.putFile('blob.bin', bytes, { encrypt: false, contentType: 'application/octet-stream' });
  const got = new Uint8Array(await storage.getFile('blob.bin', { decrypt: false }));
  eq(got.length, bytes.length, 'length');
  for (let i = 0; i < bytes.length; i++) if (got[i] !== bytes[i]) throw new Error(`byte ${i} differs`);
});

await check('putFile/getFile encrypted, 1 MB', async () => {
  const text = 'x'.repeat(1 << 20);
  await storage.putFile('big-secret.txt', text, { encrypt: true });
  eq(await storage.getFile('big-secret.txt', { decrypt: true }), text, 'decrypted');
});

const listed = async () => {
  const names = [];
  const count = await storage.listFiles((name) => {
    names.push(name);
    return true;
  });
  eq(count, names.length, 'count');
  return names.sort();
};

await check('listFiles', async () => {
  const names = await listed();
  const want = ['big-secret.txt', 'blob.bin', 'both.json', 'plain.txt', 'raw/hello.txt', 'secret.json', 'signed.txt', 'signed.txt.sig'];
  eq(JSON.stringify(names), JSON.stringify(want), 'names');
});

await check('deleteFile', async () => {
  await storage.deleteFile('plain.txt');
  await storage.deleteFile('signed.txt', { wasSigned: true });
  let missing = false;
  try {
    await storage.getFile('plain.txt', { decrypt: false });
  } catch (e) {
    missing = true;
  }
  eq(missing, true, 'getFile after delete fails');
  const r = await fetch(`${hubConfig.url_prefix}${hubConfig.address}/plain.txt`);
  eq(r.status, 404, 'read after delete');
  const names = await listed();
  eq(names.includes('plain.txt') || names.includes('signed.txt') || names.includes('signed.txt.sig'), false, 'listed after delete');
  // And the path can be written again.
  await storage.putFile('plain.txt', 'reborn', { encrypt: false });
  eq(await storage.getFile('plain.txt', { decrypt: false }), 'reborn', 'rewritten');
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
