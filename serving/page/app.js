// The page's behaviour (serving/page/index.html): find the served model through the API, send what the
// user picks or types to the task endpoint, and draw the answer as the tools show it (top-k as bars
// with labels and scores, the PNGs the writers make, detections listed, the GLUE prediction, the
// translation). Plain browser JavaScript with no library, so the page needs no build and no CDN.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  // Relative to the page, so a server behind a path prefix (a reverse proxy) still works.
  const api = (path) => new URL(path, document.baseURI).toString();
  const state = { name: null, task: null };

  // Builds an element: el("li", {class: "x", "data-label": "a"}, child, "text", ...).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // The server's one error line ({"error": "..."}), or the status and the start of a body that is not
  // that (a proxy's page), so what the user reads is what the server said.
  async function errorLine(response) {
    const body = await response.text();
    try {
      const parsed = JSON.parse(body);
      if (parsed && typeof parsed.error === "string") return parsed.error;
    } catch (_) { /* not JSON: said below */ }
    return `HTTP ${response.status} ${response.statusText}` + (body ? `: ${body.slice(0, 200)}` : "");
  }

  async function getJSON(path) {
    const response = await fetch(api(path), { headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(await errorLine(response));
    return response.json();
  }

  function showError(line) {
    const box = $("error");
    box.textContent = line;
    box.hidden = !line;
  }

  function setStatus(text) { $("status").textContent = text; }

  // The model's name: ?model=NAME, else the first of GET /v2's "models" (tools/serve.py adds it; the v2
  // protocol has no call that lists models). For a server without "models" (an older tools/serve.py) the
  // last resort is the name its 404 for an unknown model states ("... (this server serves 'NAME')").
  async function modelName() {
    const asked = new URLSearchParams(location.search).get("model");
    if (asked) return asked;
    const server = await getJSON("v2");
    const first = Array.isArray(server.models) ? server.models[0] : null;
    const name = first && typeof first === "object" ? first.name : first;
    if (name) return name;
    const probe = await fetch(api("v2/models/%00"), { headers: { Accept: "application/json" } });
    const said = /serves '([^']+)'/.exec(await errorLine(probe));
    if (!said) throw new Error("the server names no model (GET /v2 has no \"models\"); open this page as /?model=NAME");
    return said[1];
  }

  // Without the metadata's "task" hint, what the inputs look like: token ids are text (a segment-id
  // input: a model that also takes pairs, e.g. BERT; "src_ids": a translation), anything else files.
  function guessTask(meta) {
    const names = (meta.inputs || []).map((t) => t.name);
    const ids = (meta.inputs || []).some((t) => /INT/.test(t.datatype) && /ids/.test(t.name));
    if (!ids) return { input: "file", answer: null, accept: "" };
    if (names.includes("src_ids")) return { input: "text", answer: "translation", accept: "" };
    return { input: names.some((n) => /token_type|segment/.test(n)) ? "text_pair_optional" : "text", answer: null,
      accept: "" };
  }

  function tensorTable(caption, tensors) {
    const table = el("table", {}, el("caption", { text: caption }),
      el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "name" }),
        el("th", { scope: "col", text: "datatype" }), el("th", { scope: "col", text: "shape" }))));
    const body = el("tbody");
    for (const t of tensors || []) {
      body.append(el("tr", {}, el("td", {}, el("code", { text: t.name })), el("td", { text: t.datatype }),
        el("td", { text: "[" + (t.shape || []).join(", ") + "]" })));
    }
    table.append(body);
    return table;
  }

  // Shows the inputs the task takes: a file, one text, or a sentence pair (the metadata's "task"
  // hint); without the hint both the file and the text inputs are shown and the server decides.
  function layoutFor(task) {
    const input = task && task.input;
    $("file-fields").hidden = ["text", "text_pair", "text_pair_optional"].includes(input);
    $("text-fields").hidden = input === "file";
    $("pair-field").hidden = input === "text" || input === "file";
    const translation = task && task.answer === "translation";
    if (input === "text_pair") {
      $("text-label").textContent = "First sentence";
      $("text-pair-label").textContent = "Second sentence";
      $("text-hint").hidden = true;
    } else {
      $("text-label").textContent = translation ? "Text to translate" : "Sentence";
      $("text-pair-label").textContent = "Second sentence (for a task on pairs)";
      $("text-hint").hidden = input === "text_pair_optional";
    }
    if (task && task.accept) {
      $("file").setAttribute("accept", task.accept);
      $("file-kinds").textContent = describeAccept(task.accept);
    }
  }

  function describeAccept(accept) {
    const kinds = [];
    if (/video/.test(accept)) kinds.push("a video");
    if (/image/.test(accept)) kinds.push("an image");
    if (/tfrecord/i.test(accept)) kinds.push("a TFRecord");
    return kinds.length ? kinds.join(" or ") : accept;
  }

  async function init() {
    try {
      state.name = await modelName();
      const meta = await getJSON(`v2/models/${encodeURIComponent(state.name)}`);
      state.task = meta.task || guessTask(meta);
      document.title = `${state.name}: try the model`;
      $("model-name").textContent = state.name;
      for (const slot of document.querySelectorAll(".name-slot")) slot.textContent = state.name;
      $("model-info").textContent = [meta.platform, meta.versions && `version ${meta.versions.join(", ")}`]
        .filter(Boolean).join(" · ") || "";
      $("meta-tables").replaceChildren(tensorTable("Inputs", meta.inputs), tensorTable("Outputs", meta.outputs));
      layoutFor(state.task);
    } catch (err) {
      $("model-info").textContent = "";
      showError(err.message);
      $("submit").disabled = true;
    }
  }

  function previewFile(file) {
    const box = $("preview");
    box.replaceChildren();
    if (!file) return;
    const url = URL.createObjectURL(file);
    if (file.type.startsWith("image/")) box.append(el("img", { src: url, alt: `the chosen image ${file.name}` }));
    else if (file.type.startsWith("video/")) {
      box.append(el("video", { src: url, controls: "", muted: "", "aria-label": `the chosen video ${file.name}` }));
    }
    box.append(el("p", { class: "hint", text: `${file.name} · ${(file.size / 1024).toFixed(1)} KiB` }));
  }

  // The request for what the form holds: multipart with the file, or JSON text ({"text"},
  // {"text", "text_pair"}, or {"texts"} for several lines).
  function request() {
    const file = !$("file-fields").hidden && $("file").files[0];
    const text = $("text-fields").hidden ? "" : $("text").value.trim();
    const pair = $("pair-field").hidden ? "" : $("text-pair").value.trim();
    if (file && text) throw new Error("give a file or text, not both");
    if (file) {
      const form = new FormData();
      form.append("file", file, file.name);
      return { method: "POST", body: form };
    }
    if (!text) throw new Error($("file-fields").hidden ? "type a text first" : "pick a file first");
    let body;
    if (pair || (state.task && state.task.input === "text_pair")) {
      if (!pair) throw new Error("type the second sentence of the pair too");
      body = { text, text_pair: pair };
    } else {
      const lines = text.split(/\n/).map((s) => s.trim()).filter(Boolean);
      body = lines.length > 1 ? { texts: lines } : { text: lines[0] };
    }
    // the texts sent, in order: a text answer's id is only its place in the request ("0", "1", ...)
    const texts = body.texts || [body.text_pair === undefined ? body.text : `${body.text} / ${body.text_pair}`];
    return { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" }, texts };
  }

  async function submit(event) {
    event.preventDefault();
    showError("");
    let init;
    try { init = request(); } catch (err) { showError(err.message); return; }
    const button = $("submit");
    button.disabled = true;
    setStatus("Running…");
    const started = performance.now();
    try {
      const { texts, ...options } = init;
      const response = await fetch(api(`v2/models/${encodeURIComponent(state.name)}/task`), options);
      if (!response.ok) {
        $("answer-card").hidden = true;
        showError(await errorLine(response));
        setStatus("");
        return;
      }
      const result = await response.json();
      drawAnswers(result.answers || [], texts);
      $("answer-json").textContent = JSON.stringify(withoutFiles(result), null, 2);
      setStatus(`Answered in ${((performance.now() - started) / 1000).toFixed(2)} s`);
    } catch (err) {
      showError(`the server did not answer: ${err.message}`);
      setStatus("");
    } finally {
      button.disabled = false;
    }
  }

  // The JSON shown under the answer, with each file's base64 replaced by its size (it can be MBs).
  function withoutFiles(result) {
    return JSON.parse(JSON.stringify(result, (key, value) => {
      if (key === "files" && value && typeof value === "object") {
        const sizes = {};
        for (const [role, data] of Object.entries(value)) {
          sizes[role] = `<${Math.floor(String(data).length * 3 / 4)} bytes of PNG>`;
        }
        return sizes;
      }
      return value;
    }));
  }

  // `texts`: what was typed, one per answer, shown as its heading (a file's answer shows its id, the name).
  function drawAnswers(answers, texts) {
    const box = $("answers");
    box.replaceChildren();
    if (!answers.length) box.append(el("p", { text: "The server answered with no answer." }));
    const headings = texts && texts.length === answers.length ? texts : null;
    answers.forEach((answer, i) => box.append(drawAnswer(answer, headings ? headings[i] : null)));
    $("answer-card").hidden = false;
  }

  // One answer: its id, then whatever task keys it carries (an answer may carry several).
  function drawAnswer(answer, text) {
    const part = el("article", { class: "answer" }, text === null
      ? el("h3", { class: "answer-id", text: answer.id ?? "" })
      : el("h3", { class: "answer-id answer-text", title: `answer ${answer.id}`, text: `“${text}”` }));
    let drawn = false;
    if (answer.error) { part.append(el("p", { class: "answer-error", text: answer.error })); drawn = true; }
    if (Array.isArray(answer.top_k)) { part.append(topK(answer.top_k)); drawn = true; }
    if (typeof answer.prediction === "string" || typeof answer.prediction === "number") {
      part.append(el("p", { class: "prediction" }, "Prediction: ", el("strong", { text: String(answer.prediction) })));
      drawn = true;
    }
    if (typeof answer.translation === "string") {
      part.append(el("blockquote", { class: "translation", lang: "", text: answer.translation }));
      drawn = true;
    }
    if (Array.isArray(answer.classes)) {
      part.append(el("p", { class: "classes" }, "Classes present: ", answer.classes.join(", ")));
      drawn = true;
    }
    const files = answer.files || {};
    const figures = el("div", { class: "figures" });
    const roles = [["overlay", "Overlay"], ["label", "Label map (palette PNG)"], ["drawn", "Detections drawn"]];
    for (const [role, caption] of roles) {
      if (files[role]) figures.append(figure(role, files[role], caption, answer.id));
    }
    if (figures.children.length) { part.append(figures); drawn = true; }
    if (Array.isArray(answer.detections)) { part.append(detections(answer.detections)); drawn = true; }
    if (!drawn) part.append(el("pre", { text: JSON.stringify(answer, null, 2) }));
    return part;
  }

  // Top-k as horizontal bars: the label, a bar as long as the score (0..1), the score as tools/infer.py
  // prints it (3 decimals).
  function topK(rows) {
    const list = el("ol", { class: "top-k", "aria-label": "top classes, best first" });
    for (const row of rows) {
      const score = Number(row.score);
      const pct = Math.max(0, Math.min(1, score)) * 100;
      list.append(el("li", { class: "top-k-row", "data-label": row.label, "data-score": String(score) },
        el("span", { class: "top-k-label", title: `class id ${row.class_id}`, text: row.label }),
        el("span", { class: "top-k-bar", role: "img", "aria-label": `${row.label}: ${score.toFixed(3)}` },
          el("span", { class: "top-k-fill", style: `width: ${pct.toFixed(2)}%` })),
        el("span", { class: "top-k-score", text: score.toFixed(3) })));
    }
    return list;
  }

  function figure(role, base64, caption, id) {
    return el("figure", { class: `file-${role}` },
      el("img", { src: `data:image/png;base64,${base64}`, alt: `${caption} of ${id ?? "the input"}`,
        "data-role": role }),
      el("figcaption", { text: caption }));
  }

  function detections(rows) {
    if (!rows.length) return el("p", { class: "detections-none", text: "No detections." });
    const table = el("table", { class: "detections" }, el("caption", { text: `${rows.length} detections` }),
      el("thead", {}, el("tr", {}, ...["label", "score", "x", "y", "width", "height", "mask"]
        .map((h) => el("th", { scope: "col", text: h })))));
    const body = el("tbody");
    for (const d of rows) {
      const [x, y, w, h] = d.bbox || [];
      body.append(el("tr", { "data-label": d.label }, el("td", { text: d.label }),
        el("td", { text: Number(d.score).toFixed(3) }),
        ...[x, y, w, h].map((v) => el("td", { class: "num", text: v === undefined ? "" : Number(v).toFixed(1) })),
        el("td", { text: d.segmentation ? "RLE" : "" })));
    }
    table.append(body);
    return table;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("task-form").addEventListener("submit", submit);
    $("file").addEventListener("change", () => previewFile($("file").files[0]));
    init();
  });
})();
