// Building the page from data with textContent only: run names, paths and the diagnosis' text never
// become markup, so nothing in a log folder can inject a script into the tab.

export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") element.className = value;
    else if (name === "style") Object.assign(element.style, value); // CSSOM: not an inline style attribute
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : value);
  }
  append(element, children);
  return element;
}

export function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

// The diagnosis writes code between backticks, as the command line prints it: shown as code here.
export function prose(text) {
  const parts = String(text ?? "").split("`");
  return parts.map((part, index) => (index % 2 ? h("code", {}, part) : part));
}

export function number(value, digits = 1, unit = "") {
  if (value === null || value === undefined || Number.isNaN(value)) return "n/a";
  return value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits }) + unit;
}

export function ms(value) {
  if (value === null || value === undefined) return "n/a";
  return value >= 0.95 ? `${number(value, 1)} ms` : `${number(value, 2)} ms`;
}

export function megabytes(value) {
  return value >= 10 ? `${number(value, 0)} MB` : `${number(value, 1)} MB`;
}

// Stable ids for anchors, from names that may hold slashes and dots.
export function anchor(kind, name) {
  return `${kind}-${encodeURIComponent(name).replace(/%/g, "_")}`;
}
