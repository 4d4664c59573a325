// Lyre playground (served at / by lyre.api.http.playground). Plain JavaScript, no build step.
//
// Speaking: one WebSocket to /v1/audio/stream, kept open between utterances. Each utterance is
// {"text", "voice", "response_format": "pcm", "sample_rate"}: binary frames of s16le mono PCM at
// that rate, then {"done": true, "metrics"}; {"cancel": true} stops it, answered by
// {"done": true, "cancelled": true}, after which no frame of it comes. The AudioContext runs at
// the stream's rate when the browser allows it; the rate asked for is the context's own.
//
// On a keyed server (GET /v1/voices answers 401) the page asks for an API key once. The key is
// kept in a variable of this closure only (never in storage, a cookie or a URL) and exchanged for
// short-lived tokens (POST /v1/auth/tokens), sent as Bearer on REST and as the subprotocol
// "lyre-token.<token>" beside "lyre" on the WebSocket.
//
// For tests and the curious, #status carries the state in data attributes: data-state (loading,
// key-needed, ready, connecting, speaking, cancelling, done, cancelled, error), data-frames,
// data-samples, data-ttfb-ms, data-server-ttfb-ms, data-sample-rate, data-level, data-peak-level,
// data-playing, data-keyed and data-error.
"use strict";

(() => {
  const STREAM = "/v1/audio/stream";
  const TOKEN_PROTOCOL = "lyre-token."; // lyre.trust.tokens.SUBPROTOCOL
  const TOKEN_TTL_S = 60; // a token only has to start a connection or a request
  const TOKEN_MARGIN_S = 10; // a token this close to its expiry is replaced before use
  const STREAM_RATE = 24000; // the models' own rate: the AudioContext is asked to run at it
  const MIN_RATE = 8000, MAX_RATE = 48000; // the rates the server resamples to (lyre.audio.formats)
  const LEAD_S = 0.05; // audio that finds the queue empty starts this far ahead of now
  const FLOOR_DB = -60; // the level meter's bottom

  const $ = (id) => document.getElementById(id);
  const status = $("status");

  let apiKey = null; // only here, for minting tokens; null on a keyless server
  let token = null; // {value, renewAt: performance.now() ms}
  let socket = null; // the open WebSocket, reused between utterances
  let player = null; // {ctx, analyser, rate, next, sources, scratch}
  let run = null; // the utterance being spoken: {started, frames, bytes, firstAt, cancelled}
  let voicesLoaded = false;
  let metering = false;

  class KeyRefused extends Error {}

  // ---------------------------------------------------------------------------------------
  // what the page shows

  function show(fields) {
    for (const [name, value] of Object.entries(fields)) status.dataset[name] = String(value);
    const d = status.dataset;
    $("state").textContent = d.state;
    $("ttfb").textContent = d.ttfbMs ? `${d.ttfbMs} ms` : "–";
    $("server-ttfb").textContent = d.serverTtfbMs ? `${d.serverTtfbMs} ms` : "–";
    $("frames").textContent = d.frames;
    const rate = Number(d.sampleRate);
    $("seconds").textContent = `${rate ? (Number(d.samples) / rate).toFixed(2) : "0.00"} s`;
    $("rate").textContent = rate ? `${rate} Hz` : "–";
    $("error").textContent = d.error;
    $("error").hidden = !d.error;
    const busy = ["connecting", "speaking", "cancelling"].includes(d.state);
    $("speak").disabled = busy || !voicesLoaded;
    $("voice").disabled = busy || !voicesLoaded;
    $("cancel").disabled = !["connecting", "speaking"].includes(d.state) && d.playing !== "true";
  }

  function fail(message) {
    stopPlayback();
    run = null;
    show({ state: "error", error: message });
  }

  // ---------------------------------------------------------------------------------------
  // REST, with a token on a keyed server

  async function reason(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || response.statusText;
    } catch {
      return response.statusText;
    }
  }

  async function api(path) {
    const headers = {};
    if (status.dataset.keyed === "true") headers.Authorization = `Bearer ${await bearer()}`;
    return fetch(path, { headers, cache: "no-store", credentials: "omit" });
  }

  async function bearer() {
    if (token !== null && performance.now() < token.renewAt) return token.value;
    if (apiKey === null) throw new KeyRefused("this server needs an API key");
    const response = await fetch("/v1/auth/tokens", {
      method: "POST", cache: "no-store", credentials: "omit",
      headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
      body: JSON.stringify({ expires_in_s: TOKEN_TTL_S }),
    });
    if (response.status === 401) throw new KeyRefused(`the server refused this API key: ${await reason(response)}`);
    if (!response.ok) throw new Error(`could not get a token (${response.status}): ${await reason(response)}`);
    const grant = await response.json();
    token = { value: grant.token, renewAt: performance.now() + (grant.expires_in_s - TOKEN_MARGIN_S) * 1000 };
    return token.value;
  }

  function askForKey(error) {
    apiKey = null;
    token = null;
    voicesLoaded = false;
    $("key-form").hidden = false;
    show({ state: "key-needed", error: error || "" });
    $("key").focus();
  }

  async function useKey(event) {
    event.preventDefault();
    const input = $("key");
    const key = input.value.trim();
    input.value = ""; // (not left in the page either)
    if (!key) return;
    apiKey = key;
    token = null;
    show({ state: "loading", error: "" });
    try {
      await bearer();
    } catch (e) {
      askForKey(e instanceof KeyRefused ? e.message : `the key could not be checked: ${e.message}`);
      return;
    }
    $("key-form").hidden = true;
    await loadVoices();
  }

  async function loadVoices() {
    show({ state: "loading" });
    let response;
    try {
      response = await api("/v1/voices");
    } catch (e) {
      if (e instanceof KeyRefused) askForKey(e.message);
      else fail(`could not list the voices: ${e.message}`);
      return;
    }
    if (response.status === 401) {
      const keyed = status.dataset.keyed === "true";
      show({ keyed: true });
      askForKey(keyed ? `the server refused the token: ${await reason(response)}` : "");
      return;
    }
    if (!response.ok) {
      fail(`could not list the voices (${response.status}): ${await reason(response)}`);
      return;
    }
    const body = await response.json();
    const select = $("voice");
    select.replaceChildren(...body.voices.map((voice) => {
      const aliases = voice.aliases && voice.aliases.length ? ` (${voice.aliases.join(", ")})` : "";
      const label = voice.type === "cloned" ? `${voice.name} (cloned)` : `${voice.name}${aliases}`;
      return new Option(label, voice.id, false, voice.id === body.default);
    }));
    voicesLoaded = select.options.length > 0;
    show(voicesLoaded ? { state: "ready" } : { state: "error", error: "the server lists no voices" });
  }

  // ---------------------------------------------------------------------------------------
  // the WebSocket

  async function openSocket() {
    if (socket !== null && socket.readyState === WebSocket.OPEN) return socket;
    const url = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${STREAM}`;
    const protocols = ["lyre"];
    if (status.dataset.keyed === "true") protocols.push(TOKEN_PROTOCOL + (await bearer()));
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols);
      ws.binaryType = "arraybuffer";
      ws.onopen = () => {
        socket = ws;
        resolve(ws);
      };
      ws.onmessage = (event) => {
        if (ws === socket) received(event.data);
      };
      ws.onclose = (event) => {
        if (ws !== socket) {
          reject(new Error(`could not open the WebSocket ${STREAM} (close code ${event.code}): the server refused ` +
            "it or cannot be reached (a page served under a public name needs its origin in server.cors_origins)"));
          return;
        }
        socket = null;
        if (run !== null) {
          const why = event.reason ? `: ${event.reason}` : "";
          fail(`the connection closed (code ${event.code}${why}) before the audio ended`);
        }
      };
    });
  }

  function received(data) {
    if (run === null) return; // (what is left of an utterance that has ended)
    if (typeof data !== "string") {
      run.frames += 1;
      run.bytes += data.byteLength;
      const fields = { frames: run.frames, samples: Math.floor(run.bytes / 2) };
      if (run.firstAt === null) {
        run.firstAt = performance.now();
        fields.ttfbMs = Math.round(run.firstAt - run.started);
      }
      if (!run.cancelled) play(new Uint8Array(data));
      show(fields);
      return;
    }
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    if (run.cancelled) { // only the cancel's answer ends it (an earlier done or error may cross the cancel)
      if (message.done && message.cancelled) {
        run = null;
        show({ state: "cancelled" });
      }
      return;
    }
    if (message.error) {
      fail(message.error.message || "the server reported an error");
    } else if (message.done) {
      const ttfb = message.metrics && message.metrics.ttfb_ms;
      run = null;
      show({ state: "done", serverTtfbMs: typeof ttfb === "number" ? Math.round(ttfb) : "" });
    } // (other messages, e.g. timing, are not shown here)
  }

  // ---------------------------------------------------------------------------------------
  // Web Audio

  function audioOut() {
    if (player !== null) {
      if (player.ctx.state === "suspended") player.ctx.resume();
      return player;
    }
    const Context = window.AudioContext || window.webkitAudioContext;
    if (!Context) throw new Error("this browser has no Web Audio (AudioContext)");
    let ctx;
    try {
      ctx = new Context({ sampleRate: STREAM_RATE, latencyHint: "interactive" });
    } catch {
      ctx = new Context(); // (its own rate: the stream is asked for that one, or resampled by Web Audio)
    }
    const analyser = ctx.createAnalyser();
    analyser.fftSize = 1024;
    analyser.connect(ctx.destination);
    const rate = ctx.sampleRate >= MIN_RATE && ctx.sampleRate <= MAX_RATE ? ctx.sampleRate : STREAM_RATE;
    player = { ctx, analyser, rate, next: 0, sources: new Set(), scratch: new Float32Array(analyser.fftSize), odd: null };
    if (ctx.state === "suspended") ctx.resume();
    return player;
  }

  function play(bytes) {
    let data = bytes;
    if (player.odd !== null) { // a sample split between two frames
      data = new Uint8Array(bytes.length + 1);
      data[0] = player.odd;
      data.set(bytes, 1);
      player.odd = null;
    }
    const count = data.length >> 1;
    if (data.length & 1) player.odd = data[data.length - 1];
    if (count === 0) return;
    const view = new DataView(data.buffer, data.byteOffset, count * 2);
    const buffer = player.ctx.createBuffer(1, count, player.rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < count; i++) channel[i] = view.getInt16(2 * i, true) / 32768;
    const source = player.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(player.analyser);
    const at = Math.max(player.next, player.ctx.currentTime + LEAD_S);
    source.start(at);
    player.next = at + buffer.duration;
    player.sources.add(source);
    source.onended = () => {
      player.sources.delete(source);
      if (player.sources.size === 0) show({ playing: false });
    };
    if (status.dataset.playing !== "true") show({ playing: true });
    if (!metering) {
      metering = true;
      requestAnimationFrame(meter);
    }
  }

  function stopPlayback() {
    if (player === null) return;
    for (const source of player.sources) {
      source.onended = null;
      try {
        source.stop();
      } catch { /* (not started yet) */ }
    }
    player.sources.clear();
    player.next = 0;
    player.odd = null;
    $("level").value = 0;
    show({ playing: false, level: 0 });
  }

  function meter() {
    if (player === null || player.sources.size === 0) {
      metering = false;
      $("level").value = 0;
      status.dataset.level = "0";
      return;
    }
    player.analyser.getFloatTimeDomainData(player.scratch);
    let sum = 0;
    for (const x of player.scratch) sum += x * x;
    const rms = Math.sqrt(sum / player.scratch.length);
    const level = rms > 0 ? Math.max(0, 1 - (20 * Math.log10(rms)) / FLOOR_DB) : 0;
    $("level").value = level;
    status.dataset.level = level.toFixed(3);
    if (level > Number(status.dataset.peakLevel)) status.dataset.peakLevel = level.toFixed(3);
    requestAnimationFrame(meter);
  }

  // ---------------------------------------------------------------------------------------
  // speak and cancel

  async function speak(event) {
    event.preventDefault();
    if (run !== null) return;
    const text = $("text").value;
    if (!text.trim()) {
      show({ error: "type some text to speak" });
      return;
    }
    const started = performance.now();
    let out;
    try {
      out = audioOut(); // (created inside the click: browsers let audio start then)
    } catch (e) {
      fail(e.message);
      return;
    }
    stopPlayback();
    const mine = (run = { started, frames: 0, bytes: 0, firstAt: null, cancelled: false });
    show({ state: "connecting", frames: 0, samples: 0, ttfbMs: "", serverTtfbMs: "", error: "",
           sampleRate: out.rate, peakLevel: 0 });
    let ws;
    try {
      ws = await openSocket();
    } catch (e) {
      if (run !== mine) return;
      if (e instanceof KeyRefused) {
        run = null;
        askForKey(e.message);
      } else {
        fail(e.message);
      }
      return;
    }
    if (run !== mine) return; // cancelled while connecting
    ws.send(JSON.stringify({ text, voice: $("voice").value, response_format: "pcm", sample_rate: out.rate }));
    show({ state: "speaking" });
  }

  function cancel() {
    stopPlayback();
    if (run === null) return; // (only the audio of an utterance that has ended was playing)
    if (status.dataset.state === "speaking" && socket !== null) {
      run.cancelled = true;
      socket.send(JSON.stringify({ cancel: true }));
      show({ state: "cancelling" });
    } else { // still connecting: nothing was sent
      run = null;
      show({ state: "cancelled" });
    }
  }

  $("key-form").addEventListener("submit", useKey);
  $("speak-form").addEventListener("submit", speak);
  $("cancel").addEventListener("click", cancel);
  show({ keyed: false, playing: false });
  loadVoices();
})();
