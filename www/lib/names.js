// Names the page (wgspec.js) and the worker (worker.js) share.

/**
 * The stored model files: the Cache API cache of small JSON files and the origin-private file
 * system folder of weight files, both under this name.
 */
export const STORE_NAME = "wgspec-models-v1";

/** The last path segment of a URL (a model's file or folder name), for names and messages. */
export function fileName(url) {
  const path = new URL(url).pathname.replace(/\/+$/, "");
  return decodeURIComponent(path.slice(path.lastIndexOf("/") + 1)) || url;
}
