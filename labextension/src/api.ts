/**
 * The one door to the server extension: REST calls and the events websocket,
 * all under `<base_url>/jupyter-cluster/api/`.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

const API = 'jupyter-cluster/api';

/** An error answered by the server, with its one-sentence message. */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

/**
 * Call a REST endpoint of the extension.
 *
 * @param endPoint - path below `jupyter-cluster/api/`, e.g. `clusters/x/scale`
 * @param init - fetch options; JSON bodies are sent as given
 */
export async function requestAPI<T>(endPoint = '', init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!response.ok) {
    const message =
      data && typeof data === 'object' && 'message' in data
        ? String((data as { message: unknown }).message)
        : `${response.status} ${response.statusText}`;
    throw new APIError(message, response.status);
  }
  return data as T;
}

/** POST a JSON body. */
export function postAPI<T>(endPoint: string, body: unknown): Promise<T> {
  return requestAPI<T>(endPoint, { method: 'POST', body: JSON.stringify(body) });
}

/** The websocket URL of the events feed (token appended when the page needs it). */
export function eventsURL(): string {
  const settings = ServerConnection.makeSettings();
  let url = URLExt.join(settings.wsUrl, API, 'events');
  if (settings.token && settings.appendToken) {
    url += `?token=${encodeURIComponent(settings.token)}`;
  }
  return url;
}
