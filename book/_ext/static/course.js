// Keyboard access to scrollable code and outputs, once the page has its final layout.
// The theme (pydata-sphinx-theme) gives every scrollable <pre> and output tabindex=0 at
// `load` and again after a resize or a DOM change; a layout change that is neither (a web
// font or the CJK font arriving late, MathJax typesetting) can make a block scrollable
// after its last pass, leaving it without a tab stop (axe: scrollable-region-focusable).
// A resize event after the fonts and MathJax are done makes the theme look again.
(() => {
  "use strict";
  const settled = async () => {
    await document.fonts.ready;
    const startup = window.MathJax && window.MathJax.startup;
    if (startup && startup.promise) await startup.promise;
    window.dispatchEvent(new Event("resize"));
  };
  if (document.readyState === "complete") settled();
  else window.addEventListener("load", settled);
})();
