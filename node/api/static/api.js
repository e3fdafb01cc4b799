// The control API's interactive page: built from /openapi.json, no other source. Reading
// operations (GET) are sent with the dashboard session; the rest show their curl line,
// since a session may only read. Values go into the page as text, never as HTML.
"use strict";

function resolve(doc, schema) {
  return schema && schema.$ref ? doc.components.schemas[schema.$ref.split("/").pop()] : schema;
}

function operation(doc, path, method, op) {
  const params = (op.parameters || []);
  const inputs = {};
  const id = `${method}-${path}`.replace(/[^a-z0-9]+/gi, "-");
  const result = h("pre", { class: "log", id: `${id}-result` }, "");
  const target = () => {
    let url = path;
    const query = new URLSearchParams();
    for (const p of params) {
      const value = inputs[p.name].value;
      if (p.in === "path") url = url.replace(`{${p.name}}`, encodeURIComponent(value));
      else if (value !== "") query.set(p.name, value);
    }
    return query.toString() ? `${url}?${query}` : url;
  };
  const body = op.requestBody ? resolve(doc, op.requestBody.content["application/json"].schema) : null;
  const curl = h("pre", { class: "log curl" });
  const showCurl = () => {
    curl.textContent = `curl -H "Authorization: Bearer $(cat $CX_HOME/api.token)"`
      + (method === "get" ? "" : ` -X ${method.toUpperCase()}`)
      + (body ? ` -H 'Content-Type: application/json' -d '{...}'` : "")
      + ` ${location.origin}${target()}`;
  };
  const fields = params.map((p) => {
    inputs[p.name] = h("input", { name: p.name, placeholder: p.in === "path" ? "required" : "optional", oninput: showCurl });
    return h("label", { class: "param" }, h("code", {}, p.name), ` (${p.in}) `, inputs[p.name]);
  });
  const send = async () => {
    result.textContent = "…";
    const answer = await fetch(target(), { credentials: "same-origin", headers: { Accept: "application/json" } });
    const text = await answer.text();
    let shown = text;
    try { shown = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* not JSON: /metrics */ }
    result.textContent = `${answer.status}\n${shown}`;
  };
  showCurl();
  return h("section", { class: "card operation", id },
    h("h2", {}, h("span", { class: `badge method-${method}` }, method.toUpperCase()), " ", h("code", {}, path)),
    h("p", { class: "hint" }, op.summary || ""),
    fields,
    body ? h("details", {}, h("summary", {}, "request body schema"), h("pre", { class: "log" }, JSON.stringify(body, null, 2))) : null,
    method === "get" ? h("button", { class: "try", onclick: send }, "Send") : null,
    curl, result);
}

async function main() {
  const answer = await fetch("/openapi.json", { credentials: "same-origin" });
  if (answer.status === 401) { location.href = "/dashboard/login"; return; }
  const doc = await answer.json();
  $("#api-version").textContent = `${doc.info.title} · version ${doc.info.version} · OpenAPI ${doc.openapi}`;
  const sections = [];
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) sections.push(operation(doc, path, method, op));
  }
  $("#operations").replaceChildren(...sections);
}

main();
