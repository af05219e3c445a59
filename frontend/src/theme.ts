// Dark mode: TensorBoard toggles `dark-mode` on its <body> (it already folds in the
// browser preference when set to follow it). Outside TensorBoard (standalone entry
// page, notebooks) fall back to prefers-color-scheme.

type Listener = (dark: boolean) => void;

function parentBody(): HTMLElement | null {
  try {
    if (window.parent === window) return null;
    return window.parent.document.body;
  } catch {
    return null;
  }
}

export function watchTheme(onChange: Listener): void {
  const media = window.matchMedia("(prefers-color-scheme: dark)");
  const body = parentBody();
  const compute = (): boolean => (body ? body.classList.contains("dark-mode") : media.matches);
  let last = compute();
  onChange(last);
  const update = (): void => {
    const now = compute();
    if (now !== last) {
      last = now;
      onChange(now);
    }
  };
  media.addEventListener("change", update);
  if (body) new MutationObserver(update).observe(body, { attributes: true, attributeFilter: ["class"] });
}
