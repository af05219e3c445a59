// esbuild's "text" loader turns a CSS import into its source string.
declare module "*.css" {
  const text: string;
  export default text;
}
