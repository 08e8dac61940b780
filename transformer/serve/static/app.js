// The page: stream a completion from /v1/completions, then ask /v1/inspect for the text's
// tokens; when a token is clicked, ask /v1/inspect for that token's row of attention weights
// in every head and the likeliest next tokens, and show them. Plain JavaScript, no
// libraries: the page works offline.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { inside: null, text: "", rows: {}, query: null, layer: 0, head: 0,
                controller: null };
window.__pieces = 0;  // how many streamed pieces arrived (the browser test reads it)

async function showModel() {
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = `${health.model} · step ${health.step} · context ` +
      `${health.context} tokens`;
    $("max_tokens").max = health.max_tokens;
    $("key-label").hidden = !health.auth;
  } catch (e) {
    $("model").textContent = "server not reachable";
  }
}

function knobs() {
  const num = (id) => Number($(id).value);
  return { prompt: $("prompt").value, max_tokens: num("max_tokens"),
           temperature: num("temperature"), top_k: num("top_k"), top_p: num("top_p"),
           seed: num("seed"), stream: true };
}

function headers() {
  // JSON, and the server's API key when it wants one (--api_key).
  const out = { "Content-Type": "application/json" };
  if ($("api_key").value) out.Authorization = `Bearer ${$("api_key").value}`;
  return out;
}

async function post(path, body, signal) {
  return fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body), signal });
}

function setBusy(busy, message) {
  $("generate").disabled = busy;
  $("stop").disabled = !busy;
  $("status").textContent = message;
}

async function generate() {
  const body = knobs();
  const output = $("output");
  output.textContent = "";
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = body.prompt;
  const textSpan = document.createElement("span");
  output.append(promptSpan, textSpan);
  $("inside").hidden = true;
  window.__pieces = 0;
  state.controller = new AbortController();
  setBusy(true, "generating…");
  let completion = "";
  try {
    const reply = await post("/v1/completions", body, state.controller.signal);
    if (!reply.ok) {
      const error = await reply.json();
      throw new Error(error.error ? error.error.message : reply.statusText);
    }
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const data = JSON.parse(event.slice(6));
        if (data.error) throw new Error(data.error.message);
        for (const choice of data.choices) {
          if (choice.text) {
            completion += choice.text;
            textSpan.textContent = completion;
            window.__pieces += 1;
          }
        }
      }
    }
    setBusy(true, "looking inside…");
    await inspect(body.prompt + completion);
    setBusy(false, "done: click a token");
  } catch (e) {
    setBusy(false, e.name === "AbortError" ? "stopped" : `error: ${e.message}`);
    if (e.name === "AbortError" && (body.prompt + completion)) {
      await inspect(body.prompt + completion);
    }
  }
}

async function inspect(text) {
  // The tokens only; a token's attention rows come when it is clicked (fetchRow()).
  const reply = await post("/v1/inspect", { text });
  const data = await reply.json();
  if (!reply.ok) throw new Error(data.error.message);
  state.inside = data;
  state.text = text;
  state.rows = {};
  const output = $("output");
  output.textContent = "";
  const joined = data.tokens.join("");
  if (joined.length < text.length && text.endsWith(joined)) {
    const before = document.createElement("span");
    before.className = "prompt";
    before.textContent = text.slice(0, text.length - joined.length);
    before.title = "before the model's context";
    output.append(before);
  }
  data.tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.className = "tok";
    span.dataset.index = i;
    span.textContent = token === "\n" ? "⏎\n" : token;
    span.title = `token ${i}: ${JSON.stringify(token)} (id ${data.ids[i]})`;
    span.addEventListener("click", () => choose(i));
    output.append(span);
  });
}

function colour(weight, max, rgb) {
  const a = max > 0 ? weight / max : 0;
  return `rgba(${rgb}, ${a.toFixed(3)})`;
}

async function fetchRow(query) {
  // Token `query`'s attention row in every layer and head, and the tokens likeliest next.
  if (!state.rows[query]) {
    const reply = await post("/v1/inspect", { text: state.text, query });
    const data = await reply.json();
    if (!reply.ok) throw new Error(data.error.message);
    state.rows[query] = data;
  }
  return state.rows[query];
}

async function choose(query) {
  try {
    await fetchRow(query);
    select(query);
  } catch (e) {
    $("status").textContent = `error: ${e.message}`;
  }
}

function select(query) {
  state.query = query;
  const data = state.inside;
  const rows = state.rows[query];
  $("inside").hidden = false;
  $("inside-title").textContent =
    `Token ${query}: ${JSON.stringify(data.tokens[query])} — where each head looked`;
  const heads = $("heads");
  heads.textContent = "";
  rows.attention.forEach((layer, l) => {
    layer.forEach((head, h) => {
      const row = document.createElement("div");
      row.className = "head" + (l === state.layer && h === state.head ? " chosen" : "");
      row.dataset.layer = l;
      row.dataset.head = h;
      const label = document.createElement("span");
      label.className = "label";
      label.textContent = `L${l} H${h}`;
      const strip = document.createElement("div");
      strip.className = "strip";
      const weights = head;  // on tokens 0 .. query
      const max = Math.max(...weights);
      weights.forEach((w, k) => {
        const cell = document.createElement("div");
        cell.className = "cell";
        cell.style.background = colour(w, max, "35, 57, 91");
        cell.title = `${JSON.stringify(data.tokens[k])}: ${w.toFixed(3)}`;
        strip.append(cell);
      });
      row.append(label, strip);
      row.addEventListener("click", () => { state.layer = l; state.head = h; select(query); });
      heads.append(row);
    });
    const gap = document.createElement("div");
    gap.className = "layer-gap";
    heads.append(gap);
  });
  tint();
  const table = $("next");
  table.textContent = "";
  for (const guess of rows.next) {
    const tr = document.createElement("tr");
    const token = document.createElement("td");
    token.textContent = JSON.stringify(guess.token);
    const prob = document.createElement("td");
    prob.textContent = guess.prob.toFixed(3);
    const barCell = document.createElement("td");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.round(guess.prob * 200)}px`;
    barCell.append(bar);
    tr.append(token, prob, barCell);
    table.append(tr);
  }
}

function tint() {
  // The text itself, tinted by the chosen head's weights from the selected token.
  const weights = state.rows[state.query].attention[state.layer][state.head];
  const max = Math.max(...weights);
  document.querySelectorAll("#output .tok").forEach((span) => {
    const k = Number(span.dataset.index);
    span.classList.toggle("selected", k === state.query);
    span.style.background = k <= state.query ? colour(weights[k], max, "209, 73, 91") : "";
  });
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate();
});
showModel();
