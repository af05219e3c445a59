// Entry point: TensorBoard's plugin_entry.html imports this module and calls render().
import uplotCss from "uplot/dist/uPlot.min.css";

import { App } from "./app";
import styles from "./styles.css";

export async function render(): Promise<void> {
  const style = document.createElement("style");
  style.textContent = uplotCss + "\n" + styles;
  document.head.appendChild(style);
  const root = document.createElement("div");
  document.body.appendChild(root);
  await new App(root).start();
}
